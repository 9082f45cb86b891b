/**
 * The ports of a stage of an optimistic run (`../lease/` `OptimisticRun`): the stage's code is
 * unchanged, its writes are gated where they leave the process. Any tool run, object-store write
 * or finalizer change first claims the run lease; a status write of a run that claimed nothing
 * first checks the lease and is never re-planned on a 409 (see `OptimisticRun`). Reads, Events
 * and token requests pass as they are: they change no state another run depends on.
 *
 * @module
 */
import { type ClusterRegistry, ConflictError, type DeployView, type FetchView, type KubeObject } from '../kube/port.js';
import type { OptimisticRun } from '../lease/index.js';
import type { DispatchDeps } from '../pipeline/dispatch.js';

/** Object-store methods that write. */
const STORE_WRITES = new Set(['put', 'putIfAbsent', 'putIfMatch', 'delete']);
/** Cluster-view methods that write the object a run works for, besides its status. */
const VIEW_WRITES = new Set(['addFinalizer', 'removeFinalizer']);

/**
 * `target` with the methods named in `names` awaiting `before()` first, unless `exempt` says the
 * call changes nothing.
 */
function gateMethods<T extends object>(
  target: T,
  names: Set<string>,
  before: () => Promise<void>,
  exempt: (method: string, args: unknown[]) => boolean = () => false,
): T {
  return new Proxy(target, {
    get(t, prop) {
      const value = Reflect.get(t, prop, t) as unknown;
      if (typeof value !== 'function') return value;
      if (typeof prop !== 'string' || !names.has(prop)) return value.bind(t);
      return async (...args: unknown[]) => {
        if (!exempt(prop, args)) await before();
        return (await value.apply(t, args)) as unknown;
      };
    },
  });
}

/**
 * A finalizer change the view makes no request for: the caller passes the object as it holds it
 * (`FinalizerOptions.object`) and the finalizer is already on it (add) or not on it (remove).
 */
function finalizerUnchanged(method: string, args: unknown[]): boolean {
  const [, finalizer, options] = args as [unknown, string, { object?: KubeObject } | undefined];
  const on = options?.object?.metadata.finalizers?.includes(finalizer);
  return on === undefined ? false : method === 'addFinalizer' ? on : !on;
}

/** A cluster view whose writes are gated, and whose status writes follow the optimistic rule. */
function gateView<V extends FetchView | DeployView>(view: V, run: OptimisticRun, claim: () => Promise<void>): V {
  const gated = gateMethods(view, VIEW_WRITES, claim, finalizerUnchanged);
  return new Proxy(gated, {
    get(t, prop) {
      if (prop !== 'updateStatus') return Reflect.get(t, prop, t) as unknown;
      return async (...args: Parameters<FetchView['updateStatus']>) => {
        if (run.held) return await view.updateStatus(...args);
        await run.verify();
        try {
          return await view.updateStatus(...args);
        } catch (err) {
          // Planned on the App as read before the check: a 409 means somebody wrote it since.
          if (err instanceof ConflictError && !run.held) run.conflict();
          throw err;
        }
      };
    },
  });
}

/**
 * The stage's ports for an optimistic run.
 *
 * @param claim - claims the lease (`OptimisticRun.claim`, plus the stage handler's renewals);
 *   rejects with `LeaseContendedError` when the run must stop.
 */
export function gatedPorts(deps: DispatchDeps, run: OptimisticRun, claim: () => Promise<void>): DispatchDeps {
  const clusters: ClusterRegistry = new Proxy(deps.clusters, {
    get(t, prop) {
      const value = Reflect.get(t, prop, t) as unknown;
      if (prop === 'fetchView' || prop === 'deployView') {
        return (id: string) => gateView((value as (id: string) => FetchView).call(t, id), run, claim);
      }
      return typeof value === 'function' ? value.bind(t) : value;
    },
  });
  return {
    ...deps,
    clusters,
    store: gateMethods(deps.store, STORE_WRITES, claim),
    runner: gateMethods(deps.runner, new Set(['run']), claim),
  };
}

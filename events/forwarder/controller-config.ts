/**
 * The forwarder's watch of this cluster's `kapp-controller-config` Secret and ConfigMap
 * (reference §1.3, `functions/lib/reconcile/controller-config.ts`): one object each, listed and
 * watched by name (field selector), so the watch costs nothing when its namespace holds many
 * Secrets. Upstream's controller reloads its config when either changes; here the caller drops
 * what it cached (the embedded runtime's per-cluster config). No object event is sent for it:
 * it is not part of the forwarder's event rules (`README.md`).
 *
 * @module
 */
import type { ResourceKind } from '../../functions/lib/kube/port.js';
import { CONTROLLER_CONFIG_NAME } from '../../functions/lib/reconcile/controller-config.js';
import type { ForwarderLogger } from './log.js';
import type { ReflectorHandler } from './reflector.js';

/** Field selector of the watch: `metadata.name=kapp-controller-config`. */
export const CONTROLLER_CONFIG_SELECTOR = `metadata.name=${CONTROLLER_CONFIG_NAME}`;

/**
 * The reflector handler of the one `kapp-controller-config` object of `resource` (Secret or
 * ConfigMap): calls `onChange` when the object's resourceVersion moves (deleted: `''`) and after
 * a first list (a change made while the forwarder was away). A throw of `onChange` is logged and
 * ignored; the object's content is never logged (a Secret's values may be sensitive).
 *
 * @param resource - The watched kind, named in the log line.
 * @param onChange - What the caller does on a change; must not throw.
 * @param logger - Where the change (and a failed `onChange`) is logged.
 * @param clusterId - This cluster's id, carried by each log line.
 */
export function controllerConfigHandler(
  resource: ResourceKind,
  onChange: () => void,
  logger: ForwarderLogger,
  clusterId: string,
): ReflectorHandler {
  let seen: string | undefined;
  let listed = '';
  const changed = (rv: string) => {
    seen = rv;
    logger.info({ clusterId, kind: resource.kind }, 'kapp-controller-config changed');
    try {
      onChange();
    } catch (err) {
      logger.warn({ clusterId, error: (err as Error).message }, 'kapp-controller-config onChange failed');
    }
  };
  return {
    listStart: () => {
      listed = '';
    },
    listItem: (obj) => {
      listed = obj.metadata.resourceVersion ?? '';
    },
    listEnd: (mode) => {
      if (mode === 'initial' || listed !== seen) changed(listed);
    },
    event: (e) => {
      const rv = e.type === 'DELETED' ? '' : (e.object.metadata.resourceVersion ?? '');
      if (rv !== seen) changed(rv);
    },
  };
}

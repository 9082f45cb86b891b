/**
 * Makes the runtime process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)` through the small
 * Node-API addon built from `layers/native/harden.c`), so that a tool it starts cannot read
 * the runtime's `/proc/<pid>/environ` (the function role's AWS credentials on Lambda) or
 * `/proc/<pid>/mem`, even when the tool runs under the same uid, which is the case on Lambda
 * where the function cannot switch uids. Node has no built-in for `prctl`.
 *
 * @module
 */

interface HardenAddon {
  setNotDumpable(): number;
  isDumpable(): boolean;
  setChildSubreaper(): number;
  reapChild(pid: number): number;
}

let loaded: HardenAddon | undefined;

function load(addonPath: string): HardenAddon {
  if (loaded) return loaded;
  const mod = { exports: {} as HardenAddon };
  try {
    process.dlopen(mod, addonPath);
  } catch (err) {
    throw new Error(`cannot load the hardening addon ${addonPath}: ${(err as Error).message}`);
  }
  loaded = mod.exports;
  return loaded;
}

/**
 * Marks this process non-dumpable. Idempotent.
 *
 * @param addonPath - the compiled addon (`hardenAddonPath()` locally, `/opt/lib/kapp-lambda-harden.node` on Lambda)
 * @throws Error when the addon cannot be loaded or `prctl` fails (the runtime must not start
 *   unprotected)
 */
export function hardenProcess(addonPath: string): void {
  const addon = load(addonPath);
  const rc = addon.setNotDumpable();
  if (rc !== 0) throw new Error(`prctl(PR_SET_DUMPABLE, 0) failed with errno ${rc}`);
}

/**
 * Whether this process is dumpable (i.e. not hardened).
 *
 * @param addonPath - the compiled addon
 */
export function isDumpable(addonPath: string): boolean {
  return load(addonPath).isDumpable();
}

/**
 * Makes this process the child subreaper of everything it starts
 * (`prctl(PR_SET_CHILD_SUBREAPER, 1)`): a process a tool leaves behind outside the tool's
 * process group (`setsid` and a double fork) is re-parented here instead of to init, so
 * `./orphans.ts` can find and kill it. Idempotent.
 *
 * @param addonPath - the compiled addon
 * @returns a function that reaps one adopted child without blocking (`waitpid(pid, WNOHANG)`):
 *   the pid once reaped, 0 while it runs, `-errno` on error (`-ECHILD`: not a child)
 * @throws Error when the addon cannot be loaded or `prctl` fails
 */
export function becomeSubreaper(addonPath: string): (pid: number) => number {
  const addon = load(addonPath);
  const rc = addon.setChildSubreaper();
  if (rc !== 0) throw new Error(`prctl(PR_SET_CHILD_SUBREAPER, 1) failed with errno ${rc}`);
  return (pid) => addon.reapChild(pid);
}

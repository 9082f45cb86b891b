/*
 * kapp-lambda process hardening (Node-API addon, no dependencies beyond libc).
 *
 * setNotDumpable() calls prctl(PR_SET_DUMPABLE, 0) on the runtime process. A non-dumpable
 * process has its /proc/<pid> files owned by root and refuses ptrace-class access from other
 * processes of the same uid, so a tool the runtime starts (ytt, helm, vendir running a
 * tenant's input) cannot read the runtime's /proc/<pid>/environ (AWS credentials on Lambda)
 * or /proc/<pid>/mem. execve() resets the flag for the tools themselves, which need no
 * protection from each other beyond their per-run directories.
 * Returns 0 on success, or errno.
 *
 * setChildSubreaper() calls prctl(PR_SET_CHILD_SUBREAPER, 1): a process a tool leaves behind
 * after leaving the tool's process group and session (setsid, then a double fork) is
 * re-parented to the runtime instead of init, where the runtime finds and kills it
 * (functions/lib/exec/orphans.ts); on Lambda, where tools share the runtime's uid, it would
 * otherwise live on into the next invocation and read the next App's files. Returns 0 or errno.
 *
 * reapChild(pid) calls waitpid(pid, WNOHANG) for one such adopted child, which Node's own
 * child handling never waits for (it waits only for the pids it spawned): the pid when it was
 * reaped, 0 while it still runs, -errno on error.
 */
#include <errno.h>
#include <node_api.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>

static napi_value set_not_dumpable(napi_env env, napi_callback_info info) {
  (void)info;
  int rc = prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 ? 0 : errno;
  napi_value out;
  napi_create_int32(env, rc, &out);
  return out;
}

static napi_value is_dumpable(napi_env env, napi_callback_info info) {
  (void)info;
  napi_value out;
  napi_get_boolean(env, prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1, &out);
  return out;
}

static napi_value set_child_subreaper(napi_env env, napi_callback_info info) {
  (void)info;
  int rc = prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 ? 0 : errno;
  napi_value out;
  napi_create_int32(env, rc, &out);
  return out;
}

static napi_value reap_child(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  int32_t pid = 0;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_value out;
  if (argc < 1 || napi_get_value_int32(env, argv[0], &pid) != napi_ok || pid <= 0) {
    napi_create_int32(env, -EINVAL, &out);
    return out;
  }
  int status = 0;
  pid_t rc = waitpid((pid_t)pid, &status, WNOHANG);
  napi_create_int32(env, rc < 0 ? -errno : (int32_t)rc, &out);
  return out;
}

NAPI_MODULE_INIT() {
  napi_value fn;
  napi_create_function(env, "setNotDumpable", NAPI_AUTO_LENGTH, set_not_dumpable, NULL, &fn);
  napi_set_named_property(env, exports, "setNotDumpable", fn);
  napi_create_function(env, "isDumpable", NAPI_AUTO_LENGTH, is_dumpable, NULL, &fn);
  napi_set_named_property(env, exports, "isDumpable", fn);
  napi_create_function(env, "setChildSubreaper", NAPI_AUTO_LENGTH, set_child_subreaper, NULL, &fn);
  napi_set_named_property(env, exports, "setChildSubreaper", fn);
  napi_create_function(env, "reapChild", NAPI_AUTO_LENGTH, reap_child, NULL, &fn);
  napi_set_named_property(env, exports, "reapChild", fn);
  return exports;
}

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
 */
#include <errno.h>
#include <node_api.h>
#include <sys/prctl.h>

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

NAPI_MODULE_INIT() {
  napi_value fn;
  napi_create_function(env, "setNotDumpable", NAPI_AUTO_LENGTH, set_not_dumpable, NULL, &fn);
  napi_set_named_property(env, exports, "setNotDumpable", fn);
  napi_create_function(env, "isDumpable", NAPI_AUTO_LENGTH, is_dumpable, NULL, &fn);
  napi_set_named_property(env, exports, "isDumpable", fn);
  return exports;
}

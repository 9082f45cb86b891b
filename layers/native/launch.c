/*
 * kl-launch: starts one tool so that it dies with the runtime.
 *
 * Usage: kl-launch <runtime pid> <absolute tool path> [args...]
 *
 * Sets PR_SET_PDEATHSIG(SIGKILL) and then execs the tool (the setting survives execve), so a
 * runtime that is SIGKILLed (a crashed embedded process, a Lambda sandbox torn down mid-run)
 * leaves no orphaned tool behind: no kapp keeps deploying for an App while a restarted runtime
 * starts a second one. Runs after the uid switch of the spawn, which would clear the setting.
 * Exits 127 with "kl-launch: <path>: <error>" on stderr when the tool cannot be executed, and
 * 125 when the runtime is already gone.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: kl-launch <runtime pid> <tool> [args...]\n");
    return 2;
  }
  pid_t runtime = (pid_t)strtol(argv[1], NULL, 10);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
    fprintf(stderr, "kl-launch: prctl: %s\n", strerror(errno));
    return 126;
  }
  /* The runtime may have died between fork and prctl: then nobody would kill us. */
  if (getppid() != runtime) return 125;
  execv(argv[2], &argv[2]);
  fprintf(stderr, "kl-launch: %s: %s\n", argv[2], strerror(errno));
  return 127;
}

/*
 * kl-passwd.so: the passwd entry OpenSSH's client reads for its own uid, preloaded into `ssh`
 * by the egress connector's ssh wrapper (connect.c) only.
 *
 * Why: ssh starts with `getpwuid(getuid())` and exits 255 with "No user exists for uid <n>"
 * when the uid has no passwd entry, which is every tool run of a root runtime (each run gets a
 * uid of its own from a pool, functions/lib/exec/sandbox.ts, that /etc/passwd does not list),
 * so git sources over ssh could never be fetched there. And ssh takes its home from that entry,
 * never from $HOME: `~/.ssh/known_hosts` (written when an App gives no `ssh-knownhosts`, as
 * vendir then turns strict host checking off) and the default identities `~/.ssh/id_*` (tried
 * when an App's Secret has no `ssh-privatekey`) were the runtime user's, shared by every App.
 *
 * What: for the calling process's own uid, getpwuid() answers the real entry (or, when there is
 * none, one named "kl-tool" with the uid's own gid) with its home replaced by $HOME when $HOME
 * is an absolute path (the runner gives each run a private one). Other uids are answered as
 * libc does. LD_PRELOAD is removed from the environment at load, so the programs ssh starts (its
 * ProxyCommand) do not load this.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

__attribute__((constructor)) static void forget_preload(void) { unsetenv("LD_PRELOAD"); }

static char home[4096];
static char name[256];
static char shell[256];
static struct passwd own;

struct passwd *getpwuid(uid_t uid) {
  struct passwd *(*real)(uid_t) = (struct passwd * (*)(uid_t)) dlsym(RTLD_NEXT, "getpwuid");
  struct passwd *pw = real ? real(uid) : NULL;
  if (uid != getuid()) return pw;
  const char *h = getenv("HOME");
  if (pw) {
    snprintf(name, sizeof name, "%s", pw->pw_name ? pw->pw_name : "kl-tool");
    snprintf(shell, sizeof shell, "%s", pw->pw_shell ? pw->pw_shell : "/bin/sh");
    snprintf(home, sizeof home, "%s", pw->pw_dir ? pw->pw_dir : "/nonexistent");
    own.pw_gid = pw->pw_gid;
  } else {
    snprintf(name, sizeof name, "kl-tool");
    snprintf(shell, sizeof shell, "/bin/sh");
    snprintf(home, sizeof home, "/nonexistent");
    own.pw_gid = getgid();
  }
  if (h && h[0] == '/' && strlen(h) < sizeof home) snprintf(home, sizeof home, "%s", h);
  own.pw_name = name;
  own.pw_passwd = "x";
  own.pw_uid = uid;
  own.pw_gecos = "";
  own.pw_dir = home;
  own.pw_shell = shell;
  return &own;
}

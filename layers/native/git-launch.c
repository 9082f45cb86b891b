/*
 * kl-git: runs the git of a Lambda layer (Debian's git with its own loader and libraries,
 * assembled by layers/git.ts) from wherever the layer is mounted: /opt on Lambda, a cache
 * directory in tests. No absolute path is built in, so one file serves both.
 *
 * Layout (<L> = the layer root):
 *   <L>/bin/git                      this launcher (what vendir finds on PATH)
 *   <L>/git/exec/git, git-remote-http, git-remote-https
 *                                    this launcher again: GIT_EXEC_PATH, where git finds its
 *                                    helpers and itself; plus git's shell helpers (git-submodule)
 *   <L>/git/real/<name>              the real executables
 *   <L>/git/lib/ld.so, lib*.so.*     the loader and every library they link
 *   <L>/git/templates/               an empty template directory for `git init`
 *
 * It finds the layer from /proc/self/exe, sets GIT_EXEC_PATH and GIT_TEMPLATE_DIR to the
 * layer's, sets GIT_SSL_CAINFO to the system's CA bundle when the Debian path
 * (/etc/ssl/certs/ca-certificates.crt, compiled into Debian's libcurl) does not exist (Amazon
 * Linux has /etc/pki/tls/certs/ca-bundle.crt), and execs
 *   <L>/git/lib/ld.so --library-path <L>/git/lib --argv0 <argv0> <L>/git/real/<name> args...
 * so neither the system's loader nor its libraries are used. Static: it runs on any Linux.
 * Exits 127 with "kl-git: <what>: <error>" on stderr when it cannot.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const CA_BUNDLES[] = {
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
};

static int fail(const char *what) {
  fprintf(stderr, "kl-git: %s: %s\n", what, strerror(errno));
  return 127;
}

static int join(char *out, const char *a, const char *b) {
  int n = snprintf(out, PATH_MAX, "%s/%s", a, b);
  if (n < 0 || n >= PATH_MAX) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return fail("/proc/self/exe");
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (!slash) {
    errno = ENOENT;
    return fail(self);
  }
  *slash = '\0';
  const char *name = slash + 1;
  const char *dir = self;
  const char *base = strrchr(dir, '/');
  base = base ? base + 1 : dir;

  /* <L>/git/exec/<name> or <L>/bin/git */
  char rel[PATH_MAX], root[PATH_MAX];
  if (join(rel, dir, strcmp(base, "exec") == 0 ? ".." : "../git") != 0) return fail(dir);
  if (!realpath(rel, root)) return fail(rel);

  char loader[PATH_MAX], libs[PATH_MAX], real[PATH_MAX], execdir[PATH_MAX], templates[PATH_MAX], tmp[PATH_MAX];
  /* git-remote-https is git-remote-http under another name (Debian links them). */
  const char *realname = strcmp(name, "git-remote-https") == 0 ? "git-remote-http" : name;
  if (join(loader, root, "lib/ld.so") || join(libs, root, "lib") || join(tmp, root, "real") ||
      join(real, tmp, realname) || join(execdir, root, "exec") || join(templates, root, "templates"))
    return fail(root);

  if (setenv("GIT_EXEC_PATH", execdir, 1) != 0 || setenv("GIT_TEMPLATE_DIR", templates, 1) != 0)
    return fail("setenv");
  if (!getenv("GIT_SSL_CAINFO") && access("/etc/ssl/certs/ca-certificates.crt", R_OK) != 0) {
    for (size_t i = 0; i < sizeof CA_BUNDLES / sizeof CA_BUNDLES[0]; i++) {
      if (access(CA_BUNDLES[i], R_OK) == 0) {
        if (setenv("GIT_SSL_CAINFO", CA_BUNDLES[i], 1) != 0) return fail("setenv");
        break;
      }
    }
  }

  char **args = calloc((size_t)argc + 7, sizeof *args);
  if (!args) return fail("calloc");
  int i = 0;
  args[i++] = loader;
  args[i++] = "--library-path";
  args[i++] = libs;
  args[i++] = "--argv0";
  args[i++] = argc > 0 ? argv[0] : (char *)name;
  args[i++] = real;
  for (int a = 1; a < argc; a++) args[i++] = argv[a];
  args[i] = NULL;
  execv(loader, args);
  return fail(loader);
}

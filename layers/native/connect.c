/*
 * kl-connect: sends git's own protocol (git://) and ssh through the egress proxy.
 *
 * Usage:
 *   kl-connect <host> <port>   git's GIT_PROXY_COMMAND, ssh's ProxyCommand: opens
 *                              `CONNECT <host>:<port>` at the egress proxy named by
 *                              `KL_EGRESS_PROXY`, then relays stdin/stdout to the tunnel.
 *   ssh [args...]              (this file installed as `ssh` ahead of the system's on PATH) runs
 *                              the first `ssh` of /usr/local/bin:/usr/bin:/bin with
 *                              `-o ProxyCommand=<dir>/kl-connect %h %p` first, so vendir's
 *                              GIT_SSH_COMMAND (`ssh -F /dev/null ...`) goes through the proxy
 *                              as well; without KL_EGRESS_PROXY it runs ssh as is (a user's
 *                              own https_proxy is for http tools, not ssh, as upstream).
 *                              Either way, with `kl-passwd.so` (passwd.c) beside it, ssh runs
 *                              with it in LD_PRELOAD: a passwd entry for a uid /etc/passwd does
 *                              not list, and the run's HOME as ssh's home.
 *
 * Why: the egress proxy (functions/lib/fetch/egress-proxy.ts) resolves each target once, checks
 * every address against the URL policy and connects to the address it checked. http(s) tools
 * reach it through HTTP(S)_PROXY; git:// and ssh use no http proxy, so without this a host
 * whose DNS answer changes after the up-front check (rebinding) would lead them elsewhere.
 *
 * The proxy URL's user and password (the run's token) go out as `Proxy-Authorization: Basic`,
 * so a refusal is reported on the right run. A refused or failed CONNECT prints
 * `kl-connect: proxy refused <host>:<port>: <status line>` and the proxy's body to stderr
 * (git and ssh pass it on) and exits 1. Exits 2 on bad usage or a host with characters no
 * DNS name or IP literal has.
 */
#include <errno.h>
#include <limits.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

static int fail(int code, const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "kl-connect: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return code;
}

/* A DNS name or an IP literal (IPv6 with or without brackets): nothing a proxy line could split. */
static int valid_host(const char *h) {
  size_t n = strlen(h);
  if (n == 0 || n > 253) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = h[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
          c == ':' || c == '[' || c == ']'))
      return 0;
  }
  return h[0] != '-';
}

static int valid_port(const char *p) {
  size_t n = strlen(p);
  if (n == 0 || n > 5) return 0;
  for (size_t i = 0; i < n; i++)
    if (p[i] < '0' || p[i] > '9') return 0;
  long v = strtol(p, NULL, 10);
  return v > 0 && v < 65536;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void base64(const char *in, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    unsigned v = (unsigned char)in[i] << 16;
    if (i + 1 < n) v |= (unsigned char)in[i + 1] << 8;
    if (i + 2 < n) v |= (unsigned char)in[i + 2];
    out[o++] = B64[(v >> 18) & 63];
    out[o++] = B64[(v >> 12) & 63];
    out[o++] = i + 1 < n ? B64[(v >> 6) & 63] : '=';
    out[o++] = i + 2 < n ? B64[v & 63] : '=';
  }
  out[o] = '\0';
}

/* Parses http://[user[:pass]@]host:port[/] into its parts; 0 on success. */
static int parse_proxy(const char *url, char *host, size_t hn, char *port, size_t pn, char *auth, size_t an) {
  if (strncmp(url, "http://", 7) != 0) return -1;
  const char *p = url + 7;
  const char *end = p + strcspn(p, "/");
  const char *at = memchr(p, '@', (size_t)(end - p));
  auth[0] = '\0';
  if (at) {
    size_t n = (size_t)(at - p);
    if (n * 4 / 3 + 4 >= an) return -1;
    base64(p, n, auth);
    p = at + 1;
  }
  const char *colon = NULL;
  for (const char *q = p; q < end; q++)
    if (*q == ':') colon = q;
  if (!colon || (size_t)(colon - p) >= hn || (size_t)(end - colon - 1) >= pn) return -1;
  if (*p == '[' && colon > p + 1 && colon[-1] == ']') {
    memcpy(host, p + 1, (size_t)(colon - p - 2));
    host[colon - p - 2] = '\0';
  } else {
    memcpy(host, p, (size_t)(colon - p));
    host[colon - p] = '\0';
  }
  memcpy(port, colon + 1, (size_t)(end - colon - 1));
  port[end - colon - 1] = '\0';
  return 0;
}

/* The proxy is an IP literal (the egress proxy listens on 127.0.0.1): no resolver is linked in. */
static int dial(const char *host, const char *port) {
  struct sockaddr_in v4 = {0};
  struct sockaddr_in6 v6 = {0};
  unsigned short p = (unsigned short)strtol(port, NULL, 10);
  int fd = -1;
  if (inet_pton(AF_INET, host, &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(p);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&v4, sizeof v4) != 0) {
      close(fd);
      fd = -1;
    }
  } else if (inet_pton(AF_INET6, host, &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(p);
    fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&v6, sizeof v6) != 0) {
      close(fd);
      fd = -1;
    }
  }
  return fd;
}

static int write_all(int fd, const char *buf, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, buf, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += w;
    n -= (size_t)w;
  }
  return 0;
}

static int connect_mode(const char *host, const char *port) {
  if (!valid_host(host)) return fail(2, "not a host name: %s%s", host, "");
  if (!valid_port(port)) return fail(2, "not a port: %s%s", port, "");
  const char *url = getenv("KL_EGRESS_PROXY");
  if (!url || !*url) return fail(2, "no proxy: KL_EGRESS_PROXY is not set%s%s", "", "");
  char phost[256], pport[8], auth[1024];
  if (parse_proxy(url, phost, sizeof phost, pport, sizeof pport, auth, sizeof auth) != 0)
    return fail(2, "cannot read the proxy URL in KL_EGRESS_PROXY%s%s", "", "");
  int fd = dial(phost, pport);
  if (fd < 0) return fail(1, "cannot connect to the proxy at %s:%s", phost, pport);

  /* An IPv6 literal goes in brackets (ssh's %h gives it bare). */
  char target[300];
  if (strchr(host, ':') && host[0] != '[')
    snprintf(target, sizeof target, "[%s]:%s", host, port);
  else
    snprintf(target, sizeof target, "%s:%s", host, port);
  char req[2048];
  int n = auth[0] ? snprintf(req, sizeof req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n",
                             target, target, auth)
                  : snprintf(req, sizeof req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target);
  if (n < 0 || (size_t)n >= sizeof req || write_all(fd, req, (size_t)n) != 0)
    return fail(1, "cannot write to the proxy%s%s", "", "");

  /* The response head, read byte by byte so nothing of the tunnel is consumed. */
  char head[16384];
  size_t len = 0;
  while (len < sizeof head - 1) {
    ssize_t r = read(fd, head + len, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len++;
    if (len >= 4 && memcmp(head + len - 4, "\r\n\r\n", 4) == 0) break;
  }
  head[len] = '\0';
  char *eol = strstr(head, "\r\n");
  if (eol) *eol = '\0';
  if (strncmp(head, "HTTP/1.", 7) != 0 || strlen(head) < 12 || head[9] != '2') {
    fprintf(stderr, "kl-connect: proxy refused %s: %s\n", target, len ? head : "(no answer)");
    /* The body names the reason (the URL policy's message). */
    char body[4096];
    ssize_t r = read(fd, body, sizeof body - 1);
    if (r > 0) {
      body[r] = '\0';
      fputs(body, stderr);
    }
    close(fd);
    return 1;
  }

  struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
  char buf[65536];
  int in_open = 1;
  for (;;) {
    fds[0].fd = in_open ? 0 : -1;
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (in_open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t r = read(0, buf, sizeof buf);
      if (r > 0) {
        if (write_all(fd, buf, (size_t)r) != 0) return 1;
      } else if (r == 0 || errno != EINTR) {
        in_open = 0;
        shutdown(fd, SHUT_WR);
      }
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(fd, buf, sizeof buf);
      if (r > 0) {
        if (write_all(1, buf, (size_t)r) != 0) return 1;
      } else if (r == 0 || errno != EINTR) {
        return 0;
      }
    }
  }
}

static int ssh_mode(int argc, char **argv) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return fail(126, "cannot find itself: %s%s", strerror(errno), "");
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (!slash) return fail(126, "cannot find itself%s%s", "", "");
  *slash = '\0';

  const char *dirs[] = {"/usr/local/bin", "/usr/bin", "/bin"};
  char real[PATH_MAX] = "";
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    if (strcmp(dirs[i], self) == 0) continue;
    snprintf(real, sizeof real, "%s/ssh", dirs[i]);
    if (access(real, X_OK) == 0) break;
    real[0] = '\0';
  }
  if (!real[0]) return fail(127, "ssh: not found in /usr/local/bin:/usr/bin:/bin%s%s", "", "");

  /* ssh runs ProxyCommand through the shell, and LD_PRELOAD splits on spaces and colons: only a
   * path of plain characters goes in either. */
  int plain = 1;
  for (const char *c = self; *c; c++) {
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '/' ||
          *c == '.' || *c == '_' || *c == '-' || *c == '+'))
      plain = 0;
  }
  /* The passwd entry ssh needs for a uid /etc/passwd does not list, with the run's HOME
   * (passwd.c), when it sits beside this file. */
  char preload[PATH_MAX + 32];
  snprintf(preload, sizeof preload, "%s/kl-passwd.so", self);
  if (plain && access(preload, R_OK) == 0) setenv("LD_PRELOAD", preload, 1);

  const char *url = getenv("KL_EGRESS_PROXY");
  if (!url || !*url) {
    argv[0] = real;
    execv(real, argv);
    return fail(127, "%s: %s", real, strerror(errno));
  }
  if (!plain) return fail(126, "its directory has characters a shell would read: %s%s", self, "");
  char option[PATH_MAX + 64];
  snprintf(option, sizeof option, "ProxyCommand=%s/kl-connect %%h %%p", self);
  char **args = calloc((size_t)argc + 4, sizeof *args);
  if (!args) return 126;
  args[0] = real;
  args[1] = "-o";
  args[2] = option;
  for (int i = 1; i < argc; i++) args[i + 2] = argv[i];
  args[argc + 2] = NULL;
  execv(real, args);
  return fail(127, "%s: %s", real, strerror(errno));
}

int main(int argc, char **argv) {
  const char *name = strrchr(argv[0], '/');
  name = name ? name + 1 : argv[0];
  if (strcmp(name, "ssh") == 0) return ssh_mode(argc, argv);
  if (argc != 3) {
    fprintf(stderr, "usage: kl-connect <host> <port>\n");
    return 2;
  }
  return connect_mode(argv[1], argv[2]);
}

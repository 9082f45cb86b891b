/**
 * Checks for user strings that end up in a tool's argv (ours, or one a tool builds itself, such as
 * the `git`/`helm` commands vendir runs), so that no such string can be read as an option.
 *
 * Each check returns `undefined` for an acceptable value, or the reason it is refused (a phrase
 * the caller puts after the field name and the quoted value, see {@link quoteValue}). They follow
 * what the receiving tool itself accepts (helm's release names, Kubernetes' DNS-1123 labels, git's
 * `check-ref-format`), and in addition refuse anything that starts like an option where the tool
 * would see it as a separate argument. Pure: no I/O.
 *
 * @module
 */
import { DNS1123_LABEL_MAX, DNS1123_LABEL_REGEX } from './api/names.js';

/** At most this many characters of a refused value are quoted in an error message. */
export const QUOTED_VALUE_MAX_CHARS = 128;

/**
 * A user value as shown in an error message: JSON-quoted (so control characters and newlines are
 * visible and cannot forge lines), cut to {@link QUOTED_VALUE_MAX_CHARS} characters with `...`.
 *
 * @param value - the refused value
 * @returns e.g. `"--post-renderer=sh"`
 */
export function quoteValue(value: string): string {
  const shown = value.length > QUOTED_VALUE_MAX_CHARS ? `${value.slice(0, QUOTED_VALUE_MAX_CHARS)}...` : value;
  return JSON.stringify(shown);
}

/** The reason given for a value that starts like an option. */
export const LOOKS_LIKE_OPTION_REASON = 'it must not begin with "-" (a tool would read it as an option)';

/** Whether `value` holds an ASCII control character (C0 or DEL). */
function hasControl(value: string): boolean {
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c < 0x20 || c === 0x7f) return true;
  }
  return false;
}

/** Helm's release name regex (`pkg/chartutil/validate_name.go` `validName`). */
export const HELM_RELEASE_NAME_REGEX = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** Helm's maximum release name length (`maxReleaseNameLen`). */
export const HELM_RELEASE_NAME_MAX = 53;

/**
 * Helm's own `ValidateReleaseName` (run by `helm template` before rendering): `no name provided`
 * for `''`, otherwise helm's exact `errInvalidName` text for a name that does not match
 * {@link HELM_RELEASE_NAME_REGEX} or is longer than {@link HELM_RELEASE_NAME_MAX}. A valid release
 * name can never begin with `-`.
 *
 * @param name - release name
 * @returns `undefined` when helm accepts it, else helm's error text
 */
export function helmReleaseNameError(name: string): string | undefined {
  if (name === '') return 'no name provided';
  if (name.length > HELM_RELEASE_NAME_MAX || !HELM_RELEASE_NAME_REGEX.test(name)) {
    return `invalid release name, must match regex ${HELM_RELEASE_NAME_REGEX.source} and the length must not be longer than ${HELM_RELEASE_NAME_MAX}`;
  }
  return undefined;
}

/**
 * Kubernetes' `IsDNS1123Label` (what a namespace name must be), with its exact messages joined
 * by `; `. A valid label can never begin with `-`.
 *
 * @param value - e.g. a namespace name
 * @returns `undefined` when valid, else the API server's texts
 */
export function dns1123LabelError(value: string): string | undefined {
  const errs: string[] = [];
  if (value.length > DNS1123_LABEL_MAX) errs.push(`must be no more than ${DNS1123_LABEL_MAX} characters`);
  if (!DNS1123_LABEL_REGEX.test(value)) {
    errs.push(
      "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
    );
  }
  return errs.length > 0 ? errs.join('; ') : undefined;
}

/**
 * Why a git ref (`git.ref` of a fetch) is refused, or `undefined`. vendir v0.44 runs
 * `git fetch origin <ref without "origin/">` when the ref starts with `origin/`, and always
 * `git checkout <ref>`, both as separate arguments; so a ref is accepted only if it follows
 * `git check-ref-format --allow-onelevel` and no `/`-separated part of it begins with `-` (git
 * itself refuses branch and tag names beginning with `-`). Commit ids (hex) and `HEAD` pass.
 * Refused as well, by check-ref-format: `..`, `@{`, a lone `@`, control characters, space,
 * `~ ^ : ? * [ \`, empty parts (`//`, leading or trailing `/`), parts beginning with `.` or
 * ending with `.lock`, and a trailing `.`. Revision expressions such as `HEAD~1` are therefore
 * refused too (vendir would pass them to `git checkout`).
 *
 * @param ref - the ref as written in the App (non-empty)
 * @returns the reason, e.g. `a "/"-separated part must not begin with "-" (...)`
 */
export function gitRefError(ref: string): string | undefined {
  if (ref === '@') return 'it must not be "@"';
  if (hasControl(ref) || /[ ~^:?*[\\]/.test(ref)) {
    return 'it must not contain control characters, space or any of ~ ^ : ? * [ \\';
  }
  if (ref.includes('..')) return 'it must not contain ".."';
  if (ref.includes('@{')) return 'it must not contain "@{"';
  if (ref.endsWith('.')) return 'it must not end with "."';
  const parts = ref.split('/');
  if (parts.some((p) => p === '')) return 'it must not begin or end with "/" or contain "//"';
  for (const p of parts) {
    if (p.startsWith('-')) return 'a "/"-separated part must not begin with "-" (git would read it as an option)';
    if (p.startsWith('.')) return 'a "/"-separated part must not begin with "."';
    if (p.endsWith('.lock')) return 'a "/"-separated part must not end with ".lock"';
  }
  return undefined;
}

/** git's `<transport>::<address>` remote-helper syntax (`ext::<command>` runs a command). */
const REMOTE_HELPER = /^[A-Za-z0-9][A-Za-z0-9+.-]*::/;

/** `scheme://authority...`. */
const URL_WITH_SCHEME = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)/;

/**
 * Why a git remote URL (`git.url`) is refused, or `undefined`. vendir runs
 * `git remote add origin <url>`, and git hands the host of an ssh URL to `ssh`. Refused: a URL
 * beginning with `-`; control characters and whitespace; the remote-helper syntax
 * `<transport>::<address>` (`ext::` runs any command, `fd::` reads descriptors); a host or
 * authority (`[user@]host[:port]` of `scheme://...`, or of scp-like `[user@]host:path`) beginning
 * with `-`; for an ssh or `git://` remote, a host git would really connect to
 * ({@link gitConnectHost}) that is no DNS name or IP address, or that is not the host the URL
 * names (the one the URL policy checks).
 * Every URL git documents (`https://`, `ssh://`, `git://`, `file://`, scp-like, local paths)
 * passes otherwise. Which hosts may be reached is the URL policy's business, not this check's.
 *
 * @param url - the URL as written (non-empty)
 */
export function gitUrlError(url: string): string | undefined {
  if (url.startsWith('-')) return LOOKS_LIKE_OPTION_REASON;
  if (hasControl(url) || /\s/.test(url)) return 'it must not contain control characters or whitespace';
  if (REMOTE_HELPER.test(url)) return 'remote helper transports ("<transport>::<address>") are not allowed';
  const m = URL_WITH_SCHEME.exec(url);
  if (m) {
    const authority = m[2] ?? '';
    const host = authority.slice(authority.lastIndexOf('@') + 1).replace(/^\[/, '');
    if (authority.startsWith('-') || host.startsWith('-')) {
      return 'its host must not begin with "-" (ssh would read it as an option)';
    }
    const scheme = (m[1] ?? '').toLowerCase();
    if (SHELL_HOST_SCHEMES.has(scheme)) {
      const named = authority.slice(authority.lastIndexOf('@') + 1);
      return shellSafeHostError(named) ?? gitReachedHostError(url, named.replace(/^\[([^\]]*)\].*$|:\d*$/, '$1'));
    }
    return undefined;
  }
  const colon = url.indexOf(':');
  const slash = url.indexOf('/');
  if (colon >= 0 && (slash < 0 || colon < slash)) {
    // scp-like `[user@]host:path`
    const host = url.slice(0, colon);
    const at = host.lastIndexOf('@');
    if (
      host
        .slice(at + 1)
        .replace(/^\[/, '')
        .startsWith('-')
    ) {
      return 'its host must not begin with "-" (ssh would read it as an option)';
    }
    return (
      shellSafeHostError(host.slice(at + 1)) ??
      gitReachedHostError(url, (SCP_LIKE_GIT_URL.exec(url)?.[1] ?? '').replace(/^\[|\]$/g, ''))
    );
  }
  return undefined;
}

/**
 * scp-like `[user@]host:path` (git's ssh shorthand) as the URL policy reads it: group 1 is the
 * host (an IPv6 literal in its brackets).
 */
export const SCP_LIKE_GIT_URL = /^(?:[^@/]+@)?(\[[^\]]+\]|[^:/]+):(?!\/\/)/;

/** git's transports that reach a host by ssh or by its own protocol (`connect.c` `get_protocol`). */
const GIT_CONNECT_SCHEMES: Readonly<Record<string, 'ssh' | 'git'>> = {
  ssh: 'ssh',
  'git+ssh': 'ssh',
  'ssh+git': 'ssh',
  git: 'git',
};

/** strtol(s, &end, 10) consumed all of `s` and gave a port (`connect.c` `get_host_and_port`). */
function gitPort(s: string): boolean {
  return /^[ \t\n\v\f\r]*[+-]?[0-9]+$/.test(s) && Number(s.trim()) >= 0 && Number(s.trim()) < 65536;
}

/**
 * The host git 2.39 connects to for an ssh or `git://` remote, read as its `connect.c` does
 * (`parse_connect_url`, `host_end`, `get_host_and_port`, `get_port`), or `undefined` for a URL it
 * does not connect to that way. For ssh, what follows the last `@` of the destination git hands
 * to ssh (ssh's own split); for `git://`, the host git gives `GIT_PROXY_COMMAND` or resolves.
 * git does not read a URL as a URL parser would: it percent-decodes all of a `scheme://` URL
 * first, and takes a bracketed host wherever `@[` appears, in the path too, so
 * `u@good.example:x@[evil;cmd]:path` and `ssh://good.example/x%40%5Bevil%3Bcmd%5D/path` reach
 * ssh as `evil;cmd`.
 *
 * @param url - a git remote URL
 */
export function gitConnectHost(url: string): string | undefined {
  const isUrl = /^[A-Za-z0-9][A-Za-z0-9+.-]*:\/\//.test(url);
  // url_decode: every %XX but %00 after the scheme.
  const decoded = isUrl
    ? url.replace(/%([0-9A-Fa-f]{2})/g, (all, hex: string) =>
        Number.parseInt(hex, 16) > 0 ? String.fromCharCode(Number.parseInt(hex, 16)) : all,
      )
    : url;
  let transport: 'ssh' | 'git' | undefined;
  let rest: string;
  let separator = '/';
  const scheme = decoded.indexOf('://');
  if (scheme >= 0) {
    transport = GIT_CONNECT_SCHEMES[decoded.slice(0, scheme)];
    rest = decoded.slice(scheme + 3);
  } else {
    const colon = url.indexOf(':');
    const slash = url.indexOf('/');
    if (colon < 0 || (slash >= 0 && slash < colon)) return undefined;
    transport = 'ssh';
    rest = decoded;
    separator = ':';
  }
  if (transport === undefined) return undefined;
  // host_end: a bracketed host at the start or after the first "@[" (anywhere).
  const bracketAt = (h: string): { open: number; close: number } | undefined => {
    const at = h.indexOf('@[');
    const open = at >= 0 ? at + 1 : 0;
    const close = h[open] === '[' ? h.indexOf(']', open + 1) : -1;
    return close >= 0 ? { open, close } : undefined;
  };
  const b = bracketAt(rest);
  const end = rest.indexOf(separator, b ? b.close : 0);
  if (end < 0) return undefined;
  const hostAndPort = rest.slice(0, end);
  // get_host_and_port: brackets removed, a ":<port>" after them (or in the host) dropped.
  let host = hostAndPort;
  let port = false;
  const hb = bracketAt(hostAndPort);
  if (hb) {
    host = hostAndPort.slice(0, hb.open) + hostAndPort.slice(hb.open + 1, hb.close);
    const after = hostAndPort.slice(hb.close + 1);
    const colon = after.indexOf(':');
    port = colon >= 0 && gitPort(after.slice(colon + 1));
  } else {
    const colon = host.indexOf(':');
    if (colon >= 0 && (gitPort(host.slice(colon + 1)) || colon === host.length - 1)) {
      port = colon < host.length - 1;
      host = host.slice(0, colon);
    }
  }
  if (transport === 'git') return host;
  // get_port: ssh only, when no port was found above.
  const colon = host.indexOf(':');
  if (!port && colon >= 0 && gitPort(host.slice(colon + 1))) host = host.slice(0, colon);
  return host.slice(host.lastIndexOf('@') + 1);
}

/**
 * Why an ssh or `git://` URL is refused for the host git would really connect to
 * ({@link gitConnectHost}): it must be a DNS name or an IP address, and the host the URL
 * names (`named`, what the URL policy checks), else a policy check and this one would judge
 * another host than the one ssh expands into its `ProxyCommand`.
 */
function gitReachedHostError(url: string, named: string): string | undefined {
  const reached = gitConnectHost(url);
  if (reached === undefined) return undefined;
  if (!/^[A-Za-z0-9._-]+$/.test(reached) && !/^[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*$/.test(reached)) {
    return SHELL_HOST_REASON;
  }
  if (reached !== named) {
    return `git would connect to ${quoteValue(reached)}, not to the host it names (${quoteValue(named)})`;
  }
  return undefined;
}

/**
 * Schemes whose host reaches a shell: ssh expands `%h` into its `ProxyCommand` (the egress
 * connector, `layers/native/connect.c`) through `/bin/sh`, and OpenSSH before 9.6 does not
 * refuse shell metacharacters in a host name (CVE-2023-51385); `git://` hosts go to the
 * connector's argv and are held to the same rule.
 */
const SHELL_HOST_SCHEMES = new Set(['ssh', 'git+ssh', 'ssh+git', 'git']);

/**
 * Why an ssh or `git://` host (`host[:port]`, an IPv6 literal in brackets) is refused: a DNS
 * name is letters, digits, `.`, `-` and `_`; an IP literal is that or a bracketed IPv6 address.
 */
function shellSafeHostError(hostPort: string): string | undefined {
  const host = hostPort.startsWith('[') ? hostPort.slice(0, hostPort.indexOf(']') + 1) : hostPort.replace(/:\d*$/, '');
  if (/^[A-Za-z0-9._-]+$/.test(host) || /^\[[0-9A-Fa-f:.]+\]$/.test(host)) return undefined;
  return SHELL_HOST_REASON;
}

const SHELL_HOST_REASON =
  'its host must be a DNS name or an IP address (letters, digits, ".", "-", "_"; IPv6 in brackets)';

/**
 * Why a helm chart name (`helmChart.name` of a fetch) is refused, or `undefined`. vendir runs
 * `helm fetch <name>` (after stripping a `stable/` prefix) or `helm pull oci://<repo>/<name>`, so
 * no `/`-separated part may begin with `-`; control characters and whitespace are refused too
 * (helm's chart names are lower-case letters, digits and `-`).
 *
 * @param name - the chart name as written (non-empty)
 */
export function helmChartNameError(name: string): string | undefined {
  if (hasControl(name) || /\s/.test(name)) return 'it must not contain control characters or whitespace';
  if (name.split('/').some((p) => p.startsWith('-'))) {
    return 'a "/"-separated part must not begin with "-" (helm would read it as an option)';
  }
  return undefined;
}

/**
 * Why a helm chart version or constraint (`helmChart.version`) is refused, or `undefined`: it must
 * not begin with `-` nor contain control characters (constraints such as `>=1.0 <2.0` pass).
 *
 * @param version - as written (non-empty)
 */
export function helmChartVersionError(version: string): string | undefined {
  if (version.startsWith('-')) return LOOKS_LIKE_OPTION_REASON;
  if (hasControl(version)) return 'it must not contain control characters';
  return undefined;
}

/**
 * Why a helm repository URL (`helmChart.repository.url`) is refused, or `undefined`. vendir runs
 * `helm repo add vendir-unused <url>` for http(s) repositories and `helm registry login <url
 * without "oci://">` for OCI ones, so neither the URL nor its `oci://`-stripped form may begin with
 * `-`; control characters and whitespace are refused too.
 *
 * @param url - as written (non-empty)
 */
export function helmRepositoryUrlError(url: string): string | undefined {
  if (url.startsWith('-')) return LOOKS_LIKE_OPTION_REASON;
  if (hasControl(url) || /\s/.test(url)) return 'it must not contain control characters or whitespace';
  if (url.startsWith('oci://') && url.slice('oci://'.length).startsWith('-')) {
    return 'the part after "oci://" must not begin with "-" (helm would read it as an option)';
  }
  return undefined;
}

/**
 * Why a path that is passed to a tool as a positional argument is refused, or `undefined`: it must
 * not begin with `-`. (Scoping to the template root is checked separately.)
 *
 * @param path - as written
 */
export function positionalPathError(path: string): string | undefined {
  return path.startsWith('-') ? LOOKS_LIKE_OPTION_REASON : undefined;
}

/**
 * Git configuration every git the runtime starts runs with, vendir's (it passes its own
 * environment on to `git`) and ours (`git ls-remote`, `./git-ls-remote.ts`), given through
 * git's `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_<n>`/`GIT_CONFIG_VALUE_<n>` variables (git 2.31+),
 * which reach git's helpers (`git-remote-https`) too and outrank every config file.
 *
 * `http.followRedirects=false`: git's default (`initial`) follows a redirect of the first
 * request, so a hostile git server could send git to a URL the URL policy refuses (the
 * instance metadata service at 169.254.169.254, a private address) after the policy checked
 * the source's own URL. Without redirects git only ever talks to the URL that was checked; a
 * redirecting server fails the fetch (`The requested URL returned error: 30x`). Not set
 * upstream.
 *
 * @module
 */

/** The git settings of {@link GIT_SAFETY_ENV}, in order: `[key, value]`. */
export const GIT_SAFETY_CONFIG: readonly (readonly [string, string])[] = [['http.followRedirects', 'false']];

/**
 * git settings as git's `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_<n>`/`GIT_CONFIG_VALUE_<n>` variables.
 * The variables are one list: an environment holding settings of two sources must be made from
 * both at once (merging two such environments keeps only the second's).
 */
export function gitConfigEnv(settings: readonly (readonly [string, string])[]): Readonly<Record<string, string>> {
  return Object.freeze({
    GIT_CONFIG_COUNT: String(settings.length),
    ...Object.fromEntries(
      settings.flatMap(([key, value], i) => [
        [`GIT_CONFIG_KEY_${i}`, key],
        [`GIT_CONFIG_VALUE_${i}`, value],
      ]),
    ),
  });
}

/** {@link GIT_SAFETY_CONFIG} as git's `GIT_CONFIG_*` environment variables. */
export const GIT_SAFETY_ENV: Readonly<Record<string, string>> = gitConfigEnv(GIT_SAFETY_CONFIG);

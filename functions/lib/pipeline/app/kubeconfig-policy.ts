/**
 * The URL policy over an App's kubeconfig Secret (`spec.cluster.kubeconfigSecretRef`): in the
 * cloud mode the deploy function serves every cluster of a fleet, and kapp connects wherever the
 * App's kubeconfig points, so without this check a hostile App could send kapp (with the
 * credentials it wrote itself, but from the function's network) to the Lambda Runtime API on
 * loopback, the credential endpoints on 169.254.0.0/16 or private ranges. Checked like a fetch
 * source (`../../fetch/url-policy.ts`: every address a name resolves to, the fleet's allow-list
 * applies) before kapp starts, for an early, clear refusal. That check alone does not hold:
 * kapp (client-go) follows up to 10 redirects of a `GET` to any address and resolves the
 * server's name again when it connects (DNS rebinding). So kapp then gets every cluster's
 * `proxy-url` set to the function's egress proxy (`../../fetch/egress-proxy.ts`), which checks each
 * connection, every hop and DNS answer, when it is made. An App's own `proxy-url` is refused
 * under the enforced policy, whatever the allow-list says (proxies are not chained; kept
 * simple). kapp-controller has none of this (its kapp runs in the tenant's cluster network).
 *
 * @module
 */
import type { App } from '../../api/index.js';
import { type ClusterAccess, credentialSource } from '../../deploy/kubeconfig.js';
import { kubeconfigUrls, withProxyUrl } from '../../deploy/kubeconfig-restrict.js';
import { clusterAccessFor } from '../../deploy/run.js';
import { type UrlPolicy, UrlPolicyChecker, UrlPolicyError } from '../../fetch/url-policy.js';
import type { DeployView } from '../../kube/port.js';
import type { SecretMask } from '../../reconcile/secret-mask.js';

/** The schemes client-go accepts for each kind of kubeconfig URL. */
const SCHEMES = { server: ['https', 'http'], proxy: ['http', 'https', 'socks5'] } as const;

/** Why an App's own `proxy-url` is refused under an enforced policy. */
export const KUBECONFIG_PROXY_REFUSED =
  "a kubeconfig proxy-url is not allowed (kapp connects through the deployment's egress proxy)";

/** Why a refreshing auth provider is refused under an enforced policy. */
export const REFRESHING_AUTH_PROVIDER_REFUSED =
  'an auth provider that refreshes its token is not allowed (kapp would send the refresh token to the token endpoint the issuer names, which this check cannot see)';

/**
 * Checks every URL kapp may contact with a restricted kubeconfig (`kubeconfigUrls`): each
 * cluster's `server`; refuses any `proxy-url` ({@link KUBECONFIG_PROXY_REFUSED}) and an
 * `auth-provider` that would refresh its token through an `idp-issuer-url`. Nothing is checked
 * when the policy is off.
 *
 * @param restrictedYaml - the restricted kubeconfig kapp would get
 * @param policy - the deployment's URL policy
 * @throws {UrlPolicyError} for the first URL refused (`URL policy refused kubeconfig
 *   clusters[0].cluster.server https://127.0.0.1:9001: 127.0.0.1, a loopback address, ...`)
 */
export async function checkKubeconfigUrls(restrictedYaml: string, policy: UrlPolicyChecker): Promise<void> {
  if (policy.policy.mode === 'off') return;
  for (const u of kubeconfigUrls(restrictedYaml)) {
    if (u.kind === 'token-issuer') throw new UrlPolicyError(u.label, REFRESHING_AUTH_PROVIDER_REFUSED);
    if (u.kind === 'proxy') throw new UrlPolicyError(u.label, KUBECONFIG_PROXY_REFUSED);
    await policy.checkUrlAs(u.url, u.label, SCHEMES[u.kind]);
  }
}

/**
 * `clusterAccessFor` under the deployment's URL policy: an App deployed with its kubeconfig
 * Secret gets its access only when {@link checkKubeconfigUrls} passes, and, when the policy is
 * enforced and `egressProxyUrl` is given, with every cluster's `proxy-url` set to that proxy
 * (so kapp's redirects and later DNS answers are checked too). The ServiceAccount path is
 * neither checked nor proxied: its kubeconfig names the cluster's own API server from the
 * cluster registry (which may well be a private address), already pinned to the address its
 * host resolved to (`../../deploy/pin-server.ts`).
 *
 * @param policy - `PipelineConfig.urlPolicy` (absent: not checked, kapp-controller's behaviour)
 * @param egressProxyUrl - `PipelineDeps.egressProxyUrl` (absent: checked only)
 * @throws {UrlPolicyError} when the policy refuses a URL of the kubeconfig Secret; what
 *   `clusterAccessFor` throws
 */
export async function policedClusterAccess(
  app: App,
  kube: DeployView,
  mask: SecretMask,
  policy: UrlPolicy | undefined,
  egressProxyUrl?: () => Promise<string>,
): Promise<ClusterAccess> {
  const access = await clusterAccessFor(app, kube, mask);
  const source = credentialSource(app.spec, app.metadata.namespace ?? '');
  if (source.kind === 'kubeconfigSecret' && access.kubeconfigYaml) {
    return { ...access, kubeconfigYaml: await policedKubeconfig(access.kubeconfigYaml, policy, egressProxyUrl) };
  }
  return access;
}

/**
 * A kubeconfig Secret's restricted kubeconfig as this process may use it under the URL
 * policy: refused ({@link refuseServiceHostPlaceholder}, {@link checkKubeconfigUrls}) or
 * returned, with every cluster's `proxy-url` set to the egress proxy when the policy is
 * enforced and `egressProxyUrl` is given. Used for kapp's kubeconfig and for the template
 * stage's own discovery calls to an App's destination cluster
 * (`../../deploy/run.ts` `destinationKubeconfig`).
 *
 * @param restrictedYaml - the restricted kubeconfig (sensitive)
 * @param policy - the deployment's URL policy (absent: returned as is, kapp-controller's behaviour)
 * @param egressProxyUrl - the process's egress proxy (absent: checked only)
 * @throws {UrlPolicyError} when the policy refuses it
 */
export async function policedKubeconfig(
  restrictedYaml: string,
  policy: UrlPolicy | undefined,
  egressProxyUrl?: () => Promise<string>,
): Promise<string> {
  if (!policy) return restrictedYaml;
  if (policy.mode !== 'off') refuseServiceHostPlaceholder(restrictedYaml);
  await checkKubeconfigUrls(restrictedYaml, new UrlPolicyChecker(policy));
  if (policy.mode === 'enforce' && egressProxyUrl) return withProxyUrl(restrictedYaml, await egressProxyUrl());
  return restrictedYaml;
}

/** The placeholder kapp replaces, anywhere in its kubeconfig, with `KAPP_KUBERNETES_SERVICE_HOST_PORT`. */
// biome-ignore lint/suspicious/noTemplateCurlyInString: the literal placeholder kapp expands.
const SERVICE_HOST_PLACEHOLDER = '${KAPP_KUBERNETES_SERVICE_HOST_PORT}';

/** Why a kubeconfig Secret holding {@link SERVICE_HOST_PLACEHOLDER} is refused under an enforced policy. */
export const SERVICE_HOST_PLACEHOLDER_REFUSED = `the kubeconfig contains ${SERVICE_HOST_PLACEHOLDER}, which kapp replaces throughout the kubeconfig (with an empty value for a kubeconfig Secret), so the URLs checked would not be the URLs kapp uses; write the API server address itself`;

/**
 * Refuses a kubeconfig Secret that holds kapp's `${KAPP_KUBERNETES_SERVICE_HOST_PORT}`
 * placeholder. kapp substitutes it over the whole kubeconfig YAML before parsing it (with the
 * empty string when the variable is unset, as for a kubeconfig Secret), so the policy would
 * check one server URL and kapp contact another (`https://${…}@169.254.169.254` becomes
 * `https://@169.254.169.254`). kapp-controller writes the placeholder only into the kubeconfig
 * it generates for a ServiceAccount (`UPSTREAM_SA_SERVER`), which this check never sees.
 *
 * @param restrictedYaml - the restricted kubeconfig of the Secret, as kapp would get it
 * @throws {UrlPolicyError} `URL policy refused kubeconfig Secret: the kubeconfig contains …`
 */
export function refuseServiceHostPlaceholder(restrictedYaml: string): void {
  if (restrictedYaml.includes(SERVICE_HOST_PLACEHOLDER)) {
    throw new UrlPolicyError('kubeconfig Secret', SERVICE_HOST_PLACEHOLDER_REFUSED);
  }
}

/**
 * Kubernetes' name syntax (`k8s.io/apimachinery/pkg/util/validation`): the one DNS-1123 label
 * rule used by the event contract, the forwarder's settings and the helm namespace check.
 *
 * @module
 */

/**
 * Kubernetes' DNS-1123 label regex (`dns1123LabelFmt`), without the length bound
 * ({@link DNS1123_LABEL_MAX}), as upstream checks the two apart.
 */
export const DNS1123_LABEL_REGEX = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/** Kubernetes' DNS-1123 label maximum length (`DNS1123LabelMaxLength`). */
export const DNS1123_LABEL_MAX = 63;

/**
 * True when `value` is a DNS-1123 label: {@link DNS1123_LABEL_REGEX} and at most
 * {@link DNS1123_LABEL_MAX} characters (a namespace name, a cluster id).
 *
 * @param value - The name to check.
 * @returns Whether Kubernetes' `IsDNS1123Label` finds no error.
 */
export function isDns1123Label(value: string): boolean {
  return value.length <= DNS1123_LABEL_MAX && DNS1123_LABEL_REGEX.test(value);
}

/**
 * Kubernetes' DNS-1123 subdomain regex (`dns1123SubdomainFmt`): labels joined by dots, without
 * the length bound ({@link DNS1123_SUBDOMAIN_MAX}). The syntax of object names (custom resources
 * included) and of a package refName.
 */
export const DNS1123_SUBDOMAIN_REGEX = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** Kubernetes' DNS-1123 subdomain maximum length (`DNS1123SubdomainMaxLength`). */
export const DNS1123_SUBDOMAIN_MAX = 253;

/**
 * Kubernetes' error text for a value that is not a DNS-1123 subdomain (`IsDNS1123Subdomain`,
 * `RegexError(dns1123SubdomainErrorMsg, dns1123SubdomainFmt, "example.com")`), verbatim.
 */
export const DNS1123_SUBDOMAIN_MESSAGE =
  "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/**
 * True when `value` is a DNS-1123 subdomain: {@link DNS1123_SUBDOMAIN_REGEX} and at most
 * {@link DNS1123_SUBDOMAIN_MAX} characters (any object name).
 *
 * @param value - The name to check.
 * @returns Whether Kubernetes' `IsDNS1123Subdomain` finds no error.
 */
export function isDns1123Subdomain(value: string): boolean {
  return value.length <= DNS1123_SUBDOMAIN_MAX && DNS1123_SUBDOMAIN_REGEX.test(value);
}

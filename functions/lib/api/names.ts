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

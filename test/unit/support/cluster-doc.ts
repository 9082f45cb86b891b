/**
 * A cluster registry document (`clusters/<id>.json`, `functions/lib/kube/cluster-doc.ts`) for
 * unit tests of what reads the registry: an EKS-style endpoint and a certificate of the right
 * shape (only its shape is checked), with the auth and extra fields a test chooses.
 */

/** A self-signed certificate's shape, base64 (only its shape is checked). */
export const TEST_CA_DATA = Buffer.from(
  [
    '-----BEGIN CERTIFICATE-----',
    'MIIBdzCCAR2gAwIBAgIUQm9ndXNDZXJ0aWZpY2F0ZUZvclRlc3RzMAoGCCqGSM49BAMCMA8xDTALBgNVBAMMBHRl',
    'c3QwHhcNMjYwMTAxMDAwMDAwWhcNMjcwMTAxMDAwMDAwWjAPMQ0wCwYDVQQDDAR0ZXN0MFkwEwYHKoZIzj0CAQYI',
    '-----END CERTIFICATE-----',
    '',
  ].join('\n'),
).toString('base64');

/** The JSON of cluster `id`'s registry document with `auth` and any `extra` fields. */
export function clusterDocJson(id: string, auth: Record<string, unknown>, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    apiVersion: 'kapp-lambda/v1',
    kind: 'Cluster',
    id,
    endpoint: 'https://abc.gr7.eu-west-1.eks.amazonaws.com',
    caData: TEST_CA_DATA,
    auth,
    ...extra,
  });
}

/**
 * A loopback HTTP proxy in front of an S3-compatible server that notes each request (method,
 * bucket, key, the listing's prefix) and passes it on unchanged, for a test that shows what a
 * function's S3 requests reached, e.g. which keys a cluster's stage runs read and wrote when the
 * server enforces no IAM (moto). Give the function the proxy's endpoint as its S3 endpoint
 * (path-style requests, `forcePathStyle`, as the functions make them against an endpoint).
 *
 * Headers, the signature included, go on as they came (the server sees the proxy's `Host`; moto
 * does not check signatures); `Expect: 100-continue` is dropped (the body follows at once).
 * Bodies are streamed, never kept.
 *
 * @module
 */
import { once } from 'node:events';
import { createServer, request as httpRequest, type Server } from 'node:http';
import { LOOPBACK } from './servers/process.js';

/** One request the proxy passed on. */
export interface S3Request {
  /** `GET`, `HEAD`, `PUT`, `POST` or `DELETE`. */
  readonly method: string;
  readonly bucket: string;
  /** The object's key (decoded); `''` for a request on the bucket (a listing). */
  readonly key: string;
  /** `prefix` of a listing (`GET /<bucket>?list-type=2&prefix=…`), else `undefined`. */
  readonly prefix?: string;
}

/** A running recorder. */
export interface S3Recorder {
  /** `http://127.0.0.1:<port>`: the S3 endpoint to give a function. */
  readonly endpoint: string;
  /** Every request, in the order they came. */
  readonly requests: readonly S3Request[];
  stop(): Promise<void>;
}

/** The request of a path-style S3 URL (`/<bucket>/<key>?<query>`). */
export function s3RequestOf(method: string, url: string): S3Request {
  const u = new URL(url, 'http://s3.invalid');
  const [, bucket = '', ...rest] = u.pathname.split('/');
  const key = decodeURIComponent(rest.join('/'));
  const prefix = key === '' && u.searchParams.has('list-type') ? (u.searchParams.get('prefix') ?? '') : undefined;
  return { method, bucket: decodeURIComponent(bucket), key, ...(prefix === undefined ? {} : { prefix }) };
}

/**
 * Starts a recorder passing requests on to `target` (`http://host:port` of the S3 server) on a
 * free loopback port.
 */
export async function startS3Recorder(target: string): Promise<S3Recorder> {
  const upstream = new URL(target);
  const requests: S3Request[] = [];
  const server: Server = createServer((req, res) => {
    requests.push(s3RequestOf(req.method ?? 'GET', req.url ?? '/'));
    const headers = { ...req.headers };
    delete headers.expect;
    const out = httpRequest(
      { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    out.on('error', () => res.destroy());
    req.pipe(out);
  });
  server.listen(0, LOOPBACK);
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  return {
    endpoint: `http://${LOOPBACK}:${port}`,
    requests,
    stop: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * sops reaches no network (issue 27 item 4), with the real pinned sops: a file naming an
 * `hc_vault` key made sops 3.13.3 send `PUT <vault_address>/v1/transit/decrypt/k` to the address
 * the file chose, outside the URL policy. The metadata check refuses such a file (in UTF-16 too,
 * which it used to read as UTF-8 and pass), and behind the check sops's own run has a proxy that
 * refuses everything, loopback included (sops is built with the loopback patch).
 */
import { mkdir, mkdtemp, realpath, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cacheBinResolver } from '../../functions/embedded/bins.js';
import { type AppTemplate, refObjectsFrom } from '../../functions/lib/api/index.js';
import { createCommandRunner } from '../../functions/lib/exec/runner.js';
import { runTemplateSteps, type TemplateRunDeps } from '../../functions/lib/template/execute.js';
import { planTemplate, type SopsStep, sopsDecryptCommand } from '../../functions/lib/template/index.js';
import { cacheRoot } from '../../layers/gobuild.js';

const ENC = 'ENC[AES256_GCM,data:aGVsbG8=,iv:AAAAAAAAAAAAAAAAAAAAAA==,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]';
const vaultFile = (port: number) =>
  `a: ${ENC}\nsops:\n    hc_vault:\n        - vault_address: http://127.0.0.1:${port}\n          engine_path: transit\n          key_name: k\n          created_at: "2024-01-01T00:00:00Z"\n          enc: vault:v1:x\n    lastmodified: "2024-01-01T00:00:00Z"\n    mac: ${ENC}\n    version: 3.8.1\n`;
const TEMPLATE: AppTemplate[] = [{ sops: { age: { privateKeysSecretRef: { name: 'keys' } } } }];

let scratch: string;
let deps: TemplateRunDeps;
let server: Server;
let port: number;
const hits: string[] = [];

beforeAll(async () => {
  scratch = await realpath(await mkdtemp(path.join(tmpdir(), 'sops-net-')));
  await mkdir(path.join(scratch, 'home'));
  deps = {
    runner: createCommandRunner({
      allow: ['sops'],
      resolveBin: cacheBinResolver(cacheRoot()),
      home: path.join(scratch, 'home'),
      tmpDir: scratch,
    }),
    config: {},
  };
  server = createServer((req, res) => {
    hits.push(`${req.method} ${req.url}`);
    res.end('{}');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as AddressInfo).port;
});

afterAll(async () => {
  server.close();
  await rm(scratch, { recursive: true, force: true });
});

async function planned(name: string, content: Buffer) {
  const root = path.join(scratch, name, 'root');
  await mkdir(root, { recursive: true });
  await writeFile(path.join(root, 's.sops.yaml'), content);
  const plan = planTemplate({
    app: { metadata: { name: 'app', namespace: 'ns' }, spec: { template: TEMPLATE } },
    templateRoot: root,
    scratchRoot: path.join(scratch, name, 'scratch'),
    refs: refObjectsFrom({
      secrets: [{ metadata: { name: 'keys' }, data: { 'key.txt': Buffer.from('AGE-SECRET-KEY-X') } }],
    }),
  });
  return { root, steps: plan.steps };
}

describe('sops and the network', () => {
  it('refuses a UTF-16 file naming a vault address before sops runs; the address sees nothing', async () => {
    const utf16 = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(vaultFile(port), 'utf16le')]);
    const { root, steps } = await planned('utf16', utf16);
    const run = await runTemplateSteps(steps, deps, path.join(scratch, 'utf16'));
    expect(run.result.error).toBe(
      `Decrypting dir: Decrypting file '${path.join(root, 's.sops.yaml')}': it starts with a byte-order mark (only UTF-8 without one is read)`,
    );
    expect(run.runs).toBe(0);
    expect(hits).toEqual([]);
  });

  it('behind the check, sops run as planned cannot reach a vault on loopback: its proxy refuses', async () => {
    const { root, steps } = await planned('behind', Buffer.from(vaultFile(port)));
    const step = steps[0] as SopsStep;
    for (const f of step.files) {
      await mkdir(path.dirname(f.path), { recursive: true });
      await writeFile(f.path, f.content);
    }
    const cmd = sopsDecryptCommand(step, path.join(root, 's.sops.yaml'));
    const run = await deps.runner.run({ cmd: cmd.bin, args: cmd.args, env: cmd.env, timeoutMs: 10_000 });
    expect(run.exitCode).not.toBe(0);
    // sops wraps its error lines (`| ` continuations); joined, they name the dead proxy.
    expect(run.stderr.replace(/\s*\n\s*\|?\s*/g, ' ')).toContain(
      'proxyconnect tcp: dial tcp 127.0.0.1:9: connect: connection refused',
    );
    expect(hits).toEqual([]);
    // The same run without the planned proxy reaches the listener: the test can fail.
    const proxyless = Object.fromEntries(Object.entries(cmd.env).filter(([k]) => !/proxy/i.test(k)));
    await deps.runner.run({ cmd: cmd.bin, args: cmd.args, env: proxyless, timeoutMs: 10_000 });
    expect(hits).toEqual(['PUT /v1/transit/decrypt/k']);
  });
});

/**
 * The Grafana dashboard and the alert rules of `infra/monitoring/`: both rule files hold the same
 * groups, and every metric an expression names is one the code exports: kapp-controller's
 * `kappctrl_*` from `functions/lib/observe/metrics.ts`, the forwarder's from its program's
 * `/metrics` (started here with fakes, standing by), so a renamed series fails here.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { silentLogger } from '../../events/forwarder/log.js';
import { type ForwarderProgram, startForwarderProgram } from '../../events/forwarder/program.js';
import { FakeObjectWatcher } from '../../events/forwarder/testing.js';
import { COUNT_METRICS, TIME_METRICS } from '../../functions/lib/observe/metrics.js';
import { testProgramSettings } from './support/forwarder-program.js';

const DIR = new URL('../../infra/monitoring/', import.meta.url);
const read = (f: string) => readFileSync(new URL(f, DIR), 'utf8');

interface Rule {
  alert: string;
  expr: string;
  for?: string;
}
const plain = parse(read('rules.yml')) as { groups: Array<{ name: string; rules: Rule[] }> };
const operator = parse(read('prometheus-rule.yml')) as { kind: string; spec: typeof plain };
const dashboard = JSON.parse(read('grafana-dashboard.json')) as {
  panels: Array<{ title: string; targets: Array<{ expr: string }> }>;
  templating: { list: Array<{ definition?: string }> };
};

/** Names in `expr` that look like this project's series (label names and functions are not). */
function seriesNames(expr: string): string[] {
  return [...expr.matchAll(/\b(kappctrl_\w+|kapp_lambda_\w+)\b/g)].map((m) => m[1]!);
}

let program: ForwarderProgram;
const exported = new Set<string>([
  ...Object.values(COUNT_METRICS).map((m) => m.name),
  ...Object.values(TIME_METRICS).map((m) => m.name),
]);

beforeAll(async () => {
  const settings = testProgramSettings();
  const refuse = async () => {
    throw new Error('no Lease in this test');
  };
  program = await startForwarderProgram(settings, {
    watcher: new FakeObjectWatcher(),
    lease: { getLease: refuse, createLease: refuse, updateLease: refuse },
    transport: { send: async () => {} },
    identity: 'test',
    logger: silentLogger,
  });
  for (const m of (await program.metrics()).matchAll(/^# TYPE (\S+) /gm)) exported.add(m[1]!);
});

afterAll(async () => {
  await program.stop();
});

describe('infra/monitoring', () => {
  it('the PrometheusRule holds exactly the groups of rules.yml', () => {
    expect(operator.kind).toBe('PrometheusRule');
    expect(operator.spec).toEqual(plain);
  });

  it('alerts on failing reconciles, failing deletes, p95 reconcile time and the forwarder', () => {
    const alerts = plain.groups.flatMap((g) => g.rules.map((r) => r.alert));
    expect(alerts).toEqual(
      expect.arrayContaining([
        'KappReconcileFailing',
        'KappDeleteFailing',
        'KappReconcileSlow',
        'KappLambdaForwarderBacklog',
      ]),
    );
    for (const r of plain.groups.flatMap((g) => g.rules)) expect(r.for, r.alert).toMatch(/^\d+m$/);
  });

  it('every series a rule or a dashboard panel names is one the code exports', () => {
    const named = [
      ...plain.groups.flatMap((g) => g.rules.map((r) => [r.alert, r.expr] as const)),
      ...dashboard.panels.flatMap((p) => p.targets.map((t) => [p.title, t.expr] as const)),
      ...dashboard.templating.list.flatMap((v) => (v.definition ? [['variable', v.definition] as const] : [])),
    ];
    expect(exported.has('kapp_lambda_forwarder_pending_events')).toBe(true);
    for (const [where, expr] of named) {
      const names = seriesNames(expr);
      expect(names.length, `${where}: ${expr}`).toBeGreaterThan(0);
      for (const n of names) expect(exported.has(n), `${where} names ${n}`).toBe(true);
    }
  });
});

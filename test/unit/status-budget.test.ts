import { describe, expect, it } from 'vitest';
import type { AppStatus } from '../../functions/lib/api/index.js';
import { TextTail } from '../../functions/lib/exec/tail.js';
import {
  encodedTextBytes,
  MAX_STATUS_TEXT_BYTES,
  TRUNCATION_PREFIX,
  truncateTailEncoded,
} from '../../functions/lib/reconcile/redact.js';
import {
  deployStatus,
  fetchPart,
  inspectStatus,
  markFailed,
  summarizeStatus,
  templatePart,
} from '../../functions/lib/reconcile/status.js';
import {
  ETCD_MAX_REQUEST_BYTES,
  encodedSize,
  fitStatus,
  MAX_CONDITIONS,
  MIN_STATUS_BUDGET_BYTES,
  markTruncated,
  OBJECT_HEADROOM_BYTES,
  SHORT_TEXT_BYTES,
  STATUS_BUDGET_BYTES,
  statusBudgetFor,
  tooLargeStatus,
} from '../../functions/lib/reconcile/status-budget.js';

const MiB = 1024 * 1024;
const NOW = new Date('2024-01-02T03:04:05Z');

/** `n` bytes of distinct lines ending in `end`, so a kept tail is recognisable. */
function big(label: string, n: number, end = `END-OF-${label}`): string {
  const line = `${label} line with <html> & "quotes" and ünïcödé\n`;
  return line.repeat(Math.ceil(n / line.length)).slice(0, n - end.length) + end;
}

/** What the API server stores: Go's json.Marshal escapes <, >, & (6 bytes each). */
function goJsonBytes(value: unknown): number {
  return Buffer.byteLength(
    JSON.stringify(value)
      .replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
      .replace(/\\[bf]/g, '\\u0008'),
  );
}

const stage = (label: string, n: number, error?: string) => ({
  stdout: big(`${label}-stdout`, n),
  stderr: big(`${label}-stderr`, n),
  exitCode: error ? 1 : 0,
  finished: true,
  ...(error ? { error } : {}),
});

let huge: AppStatus | undefined;

/** Every stage part holds 5 MiB stdout and 5 MiB stderr; the error is 5 MiB too (built once). */
function hugeStatus(): AppStatus {
  huge ??= buildHugeStatus();
  return structuredClone(huge);
}

function buildHugeStatus(): AppStatus {
  const error = `Templating dir: ${big('error', 5 * MiB)}`;
  const parts = {
    fetch: fetchPart(stage('fetch', 5 * MiB), NOW, NOW),
    template: templatePart(stage('template', 5 * MiB, error), NOW),
    deploy: deployStatus(stage('deploy', 5 * MiB), { startedAt: NOW, updatedAt: NOW }),
    inspect: inspectStatus(stage('inspect', 5 * MiB), { updatedAt: NOW }),
  };
  const status = summarizeStatus({ observedGeneration: 1 }, 2, parts, {
    stdout: '',
    stderr: big('template-stderr', 5 * MiB),
    exitCode: 1,
    error,
    finished: true,
  });
  return status;
}

describe('encodedTextBytes / encodedSize', () => {
  it.each([
    ['ascii', 'hello world'],
    ['html escapes', '<a href="x">&amp;</a>'],
    ['controls', '\u0000\u0001\b\f\n\r\t'],
    ['unicode', 'ünïcödé ✓ 😀 \u2028\u2029'],
    ['lone surrogate', 'x\ud800y'],
  ])('never undercounts what Go or JSON.stringify write (%s)', (_name, text) => {
    const value = { status: { text, list: [text, 1, true, null] } };
    expect(encodedSize(value)).toBeGreaterThanOrEqual(goJsonBytes(value));
    expect(encodedSize(value)).toBeGreaterThanOrEqual(Buffer.byteLength(JSON.stringify(value)));
    expect(encodedTextBytes(text) + 2).toBeGreaterThanOrEqual(goJsonBytes(text));
  });
});

describe('truncateTailEncoded', () => {
  it('keeps the tail behind upstream marker within the encoded bound', () => {
    const text = big('x', 100_000, 'THE-END');
    const cut = truncateTailEncoded(text, 10_000);
    expect(cut.startsWith(TRUNCATION_PREFIX)).toBe(true);
    expect(cut.endsWith('THE-END')).toBe(true);
    expect(encodedTextBytes(cut)).toBeLessThanOrEqual(10_000);
    expect(encodedTextBytes(cut)).toBeGreaterThan(10_000 - 10);
    expect(text.endsWith(cut.slice(TRUNCATION_PREFIX.length))).toBe(true);
  });

  it('counts escapes: 100 KiB of "<" is cut to a sixth of its characters', () => {
    const cut = truncateTailEncoded('<'.repeat(100 * 1024), 60_000);
    expect(encodedTextBytes(cut)).toBeLessThanOrEqual(60_000);
    expect(cut.length - TRUNCATION_PREFIX.length).toBe(Math.floor((60_000 - 20) / 6));
  });

  it('never splits a surrogate pair and keeps one marker when cut again', () => {
    const cut = truncateTailEncoded('😀'.repeat(1000), 101);
    expect(cut).toBe(`${TRUNCATION_PREFIX}${'😀'.repeat(20)}`);
    const again = truncateTailEncoded(cut, 61);
    expect(again).toBe(`${TRUNCATION_PREFIX}${'😀'.repeat(10)}`);
  });

  it('returns short text unchanged and empty text when not even the marker fits', () => {
    expect(truncateTailEncoded('short', 5)).toBe('short');
    expect(truncateTailEncoded('x'.repeat(100), 10)).toBe('');
  });
});

describe('fitStatus', () => {
  // Building the 5 MiB fixtures (redaction of every field) takes seconds on a busy machine.
  it('a 5 MiB error and 5 MiB stdout+stderr in every stage part fit one 1 MiB budget', { timeout: 60_000 }, () => {
    const status = hugeStatus();
    // Upstream's per-field 1 MiB bound alone leaves several MiB: the write would fail.
    expect(encodedSize(status)).toBeGreaterThan(6 * MiB);
    const fitted = fitStatus(status);
    const size = encodedSize(fitted);
    expect(size).toBeLessThanOrEqual(STATUS_BUDGET_BYTES);
    expect(goJsonBytes(fitted)).toBeLessThanOrEqual(STATUS_BUDGET_BYTES);
    expect(size).toBeGreaterThan(STATUS_BUDGET_BYTES - 64 * 1024); // the room is used, not wasted

    // Shape and small fields survive untouched.
    expect(fitted.observedGeneration).toBe(2);
    expect(fitted.conditions?.map((c) => c.type)).toEqual(['ReconcileFailed']);
    expect(fitted.consecutiveReconcileFailures).toBe(1);
    expect(fitted.template?.exitCode).toBe(1);
    expect(fitted.deploy?.finished).toBe(true);
    expect(fitted.fetch?.startedAt).toBe('2024-01-02T03:04:05Z');

    // Every text keeps its tail behind the marker.
    const texts: Array<[string, string | undefined, string]> = [
      ['usefulErrorMessage', fitted.usefulErrorMessage, 'END-OF-template-stderr'],
      ['condition', fitted.conditions?.[0]?.message, 'END-OF-error'],
      ['friendlyDescription', fitted.friendlyDescription, 'END-OF-error'],
      ['template.error', fitted.template?.error, 'END-OF-error'],
      ['template.stderr', fitted.template?.stderr, 'END-OF-template-stderr'],
      ['fetch.stdout', fitted.fetch?.stdout, 'END-OF-fetch-stdout'],
      ['fetch.stderr', fitted.fetch?.stderr, 'END-OF-fetch-stderr'],
      ['deploy.stdout', fitted.deploy?.stdout, 'END-OF-deploy-stdout'],
      ['deploy.stderr', fitted.deploy?.stderr, 'END-OF-deploy-stderr'],
      ['inspect.stdout', fitted.inspect?.stdout, 'END-OF-inspect-stdout'],
      ['inspect.stderr', fitted.inspect?.stderr, 'END-OF-inspect-stderr'],
    ];
    for (const [name, text, end] of texts) {
      expect(text?.startsWith(TRUNCATION_PREFIX), name).toBe(true);
      expect(text?.endsWith(end), name).toBe(true);
    }

    // The error and usefulErrorMessage come before stdout.
    const bytes = (t: string | undefined) => encodedTextBytes(t ?? '');
    expect(bytes(fitted.conditions?.[0]?.message)).toBeLessThanOrEqual(SHORT_TEXT_BYTES);
    expect(bytes(fitted.conditions?.[0]?.message)).toBeGreaterThan(SHORT_TEXT_BYTES - 8);
    expect(bytes(fitted.usefulErrorMessage)).toBeGreaterThan(4 * bytes(fitted.template?.stderr) - 100);
    expect(bytes(fitted.template?.stderr)).toBeGreaterThan(2 * bytes(fitted.deploy?.stdout) - 100);
    expect(bytes(fitted.deploy?.stdout)).toBeGreaterThan(40 * 1024);
  });

  it('is idempotent and leaves a status that fits alone', () => {
    const fitted = fitStatus(hugeStatus());
    expect(fitStatus(fitted)).toBe(fitted);
    const small = markFailed({ observedGeneration: 1 }, 'Fetching: boom', 'stderr') as AppStatus;
    expect(fitStatus(small)).toBe(small);
  });

  it('gives a small field all it needs and the rest to the big one', () => {
    const status = summarizeStatus(undefined, 1, {
      deploy: deployStatus(
        { stdout: big('deploy-stdout', 3 * MiB), stderr: 'kapp: Error: short', exitCode: 1, finished: true },
        { startedAt: NOW, updatedAt: NOW },
      ),
    }) as AppStatus;
    const fitted = fitStatus(status, 200_000);
    expect(fitted.deploy?.stderr).toBe('kapp: Error: short');
    expect(fitted.deploy?.stdout?.endsWith('END-OF-deploy-stdout')).toBe(true);
    expect(encodedSize(fitted)).toBeLessThanOrEqual(200_000);
    expect(encodedSize(fitted)).toBeGreaterThan(199_000);
  });

  it('many conditions with long messages: at most 8 kept, all within the budget', () => {
    const conditions = Array.from({ length: 10_000 }, (_, i) => ({
      type: 'ReconcileFailed' as const,
      status: 'True' as const,
      message: big(`condition-${i}`, 4096),
    }));
    const status = { observedGeneration: 1, conditions, friendlyDescription: big('friendly', MiB) } as AppStatus;
    expect(JSON.stringify(status).length).toBeGreaterThan(40 * MiB);
    const fitted = fitStatus(status, 64 * 1024);
    expect(encodedSize(fitted)).toBeLessThanOrEqual(64 * 1024);
    expect(fitted.conditions).toHaveLength(MAX_CONDITIONS);
    expect(fitted.conditions?.[0]?.message?.endsWith('END-OF-condition-0')).toBe(true);
    expect(fitted.friendlyDescription?.startsWith(TRUNCATION_PREFIX)).toBe(true);
  });

  it('falls back to the minimal failed status when the non-text fields alone exceed the budget', () => {
    const groupKinds = Array.from({ length: 20_000 }, (_, i) => ({ group: `g${i}.example.com`, kind: `Kind${i}` }));
    const status = {
      observedGeneration: 4,
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
      deploy: { exitCode: 0, finished: true, kapp: { associatedResources: { groupKinds } } },
    } as AppStatus;
    const fitted = fitStatus(status, 64 * 1024, 4);
    expect(encodedSize(fitted)).toBeLessThanOrEqual(64 * 1024);
    expect(fitted.conditions?.[0]?.type).toBe('ReconcileFailed');
    expect(fitted.conditions?.[0]?.message).toBe('Status too large to store (its fields exceed the budget)');
    expect(fitted.deploy).toEqual({ exitCode: 0, finished: true });
  });
});

describe('statusBudgetFor', () => {
  const obj = (specBytes: number) => ({
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name: 'a', namespace: 'n' },
    spec: { fetch: [{ inline: { paths: { 'x.yml': 'x'.repeat(specBytes) } } }], template: [{ ytt: {} }] },
    status: { usefulErrorMessage: 'x'.repeat(5 * MiB) },
  });

  it('is 1 MiB for a small object, whatever its current status', () => {
    expect(statusBudgetFor(obj(100))).toBe(STATUS_BUDGET_BYTES);
    expect(statusBudgetFor(undefined)).toBe(STATUS_BUDGET_BYTES);
  });

  it('shrinks with a large spec so the whole object stays under etcd 1.5 MiB', () => {
    const o = obj(800 * 1024);
    const budget = statusBudgetFor(o);
    const { status: _s, ...rest } = o;
    expect(budget).toBe(ETCD_MAX_REQUEST_BYTES - OBJECT_HEADROOM_BYTES - encodedSize(rest));
    expect(budget).toBeLessThan(700 * 1024);
  });

  it('never goes below the floor', () => {
    expect(statusBudgetFor(obj(1.6 * MiB))).toBe(MIN_STATUS_BUDGET_BYTES);
  });
});

describe('tooLargeStatus', () => {
  it('is a short ReconcileFailed naming the rejection and the head of the error', () => {
    const attempted = hugeStatus();
    const s = tooLargeStatus(
      { consecutiveReconcileFailures: 2, consecutiveReconcileSuccesses: 0 },
      attempted,
      7,
      'updating status of App n/a: 500 etcdserver: request is too large',
    );
    const message =
      'Status too large to store (updating status of App n/a: 500 etcdserver: request is too large); first part of the error: Templating dir: error line with <html>';
    expect(s.conditions).toHaveLength(1);
    expect(s.conditions?.[0]?.type).toBe('ReconcileFailed');
    expect(s.conditions?.[0]?.message?.startsWith(message)).toBe(true);
    expect(encodedTextBytes(s.conditions?.[0]?.message ?? '')).toBeLessThanOrEqual(2048);
    expect(s.friendlyDescription).toBe(`Reconcile failed: ${s.conditions?.[0]?.message}`);
    expect(s.usefulErrorMessage).toBe(s.conditions?.[0]?.message);
    expect(s.observedGeneration).toBe(7);
    expect(s.consecutiveReconcileFailures).toBe(3);
    expect(s.consecutiveReconcileSuccesses).toBe(0);
    expect(s.template).toEqual({ exitCode: 1, updatedAt: '2024-01-02T03:04:05Z' });
    expect(encodedSize(s)).toBeLessThan(8 * 1024);
  });

  it('says DeleteFailed during a delete and redacts', () => {
    const s = tooLargeStatus(
      undefined,
      {
        conditions: [{ type: 'Deleting', status: 'True' }],
        usefulErrorMessage: 'password=hunter2 failed',
      } as AppStatus,
      3,
      '413 Request entity too large: limit is 3145728',
    );
    expect(s.conditions?.[0]).toEqual({
      type: 'DeleteFailed',
      status: 'True',
      message:
        'Status too large to store (413 Request entity too large: limit is 3145728); first part of the error: password=*** failed',
    });
    expect(s.friendlyDescription?.startsWith('Delete failed: Status too large')).toBe(true);
  });
});

describe('TextTail and markTruncated (bounded kapp output)', () => {
  it('keeps the newest characters of 8 MiB streamed in chunks and sees a marker across chunks', () => {
    const tail = new TextTail(MAX_STATUS_TEXT_BYTES, ' ---- applying ');
    const chunk = 'Target cluster ... waiting on 1 changes\n'.repeat(1000);
    tail.push(' ---- appl');
    tail.push('ying 1 changes [0/1 done] ----\n');
    for (let sent = 0; sent < 8 * MiB; sent += chunk.length) tail.push(chunk);
    tail.push('Succeeded');
    expect(tail.seen).toBe(true);
    expect(tail.truncated).toBe(true);
    expect(tail.text().length).toBe(MAX_STATUS_TEXT_BYTES);
    expect(tail.text().endsWith('waiting on 1 changes\nSucceeded')).toBe(true);
    expect(markTruncated(tail.text(), tail.truncated).startsWith(TRUNCATION_PREFIX)).toBe(true);
  });

  it('does not see a marker that never came and does not mark an uncut text', () => {
    const tail = new TextTail(100, ' ---- applying ');
    tail.push('kapp: Error: no changes ---- app');
    expect(tail.seen).toBe(false);
    expect(tail.truncated).toBe(false);
    expect(markTruncated(tail.text(), tail.truncated)).toBe('kapp: Error: no changes ---- app');
    expect(markTruncated(`${TRUNCATION_PREFIX}x`, true)).toBe(`${TRUNCATION_PREFIX}x`);
  });
});

/**
 * Status parts carried in events are bounded by their JSON-escaped size: tool output full of
 * control characters (ANSI escapes, git sideband), 6 bytes each once escaped, still gives
 * hand-off events under the event limit. Through `dispatchEvent` (object → fetch → template →
 * deploy event), faked at the ports (fake cluster, fake runner, memory store).
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { type KappEvent, MAX_EVENT_BYTES, objectEvent, serializeEvent } from '../../events/schema.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { PART_BOUNDS, toEventPart } from '../../functions/lib/reconcile/status.js';
import { appObject, appWorld, NOW, REF, SUCCEEDED_BEFORE, vendirWrites } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('event-part-escapes-');
const CONTROLS = '\x01'.repeat(40 * 1024);
const escapedBytes = (text: string | undefined) => Buffer.byteLength(JSON.stringify(text ?? '')) - 2;

describe('event parts of control-character output', () => {
  it('fetch output of 40 KiB of \\x01 gives template and deploy events under the event limit', async () => {
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), tmpRoot: path.join(tempDir(), 'scratch') });
    const vendir = vendirWrites(CONTROLS);
    w.runner.on('vendir', async (req) => ({ ...(await vendir(req)), stderr: CONTROLS }));
    w.runner.on('ytt', { stdout: 'a: 1\n', stderr: CONTROLS });
    const template = (await dispatchEvent(objectEvent(REF, 'resync', { time: new Date(NOW) }), w.deps)) as KappEvent;
    expect(template?.type).toBe('dev.kapp-lambda.stage.template.v1');
    expect(Buffer.byteLength(serializeEvent(template))).toBeLessThanOrEqual(MAX_EVENT_BYTES);
    const deploy = (await dispatchEvent(template, w.deps)) as KappEvent;
    expect(deploy?.type).toBe('dev.kapp-lambda.stage.deploy.v1');
    expect(Buffer.byteLength(serializeEvent(deploy))).toBeLessThanOrEqual(MAX_EVENT_BYTES);
  });

  it('a part whose escaped text is over the event bound is cut in the event (so it is written now)', () => {
    const part = { exitCode: 0, updatedAt: NOW, stdout: '\x01'.repeat(4 * 1024), error: '\x1b'.repeat(1000) };
    const e = toEventPart(part);
    expect(e.stdout).not.toBe(part.stdout);
    expect(escapedBytes(e.stdout)).toBeLessThanOrEqual(PART_BOUNDS.event.output);
    expect(e.error).not.toBe(part.error);
    expect(escapedBytes(e.error)).toBeLessThanOrEqual(PART_BOUNDS.event.error);
    const plain = { exitCode: 0, updatedAt: NOW, stdout: 'x'.repeat(4 * 1024) };
    expect(toEventPart(plain).stdout).toBe(plain.stdout);
  });
});

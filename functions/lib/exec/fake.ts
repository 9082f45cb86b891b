/**
 * A recording, scripted {@link CommandRunner} for unit tests of code that runs tools: it records
 * every request (argv, stdin, cwd, env, timeout) and answers from rules, so tests can assert exact
 * argv and drive every outcome (exit codes, stderr, cancellation, streaming) without processes.
 *
 * @module
 */
import {
  CommandCanceledError,
  type CommandError,
  CommandExitError,
  CommandNotAllowedError,
  type CommandRunner,
  type RunRequest,
  type RunResult,
} from './runner.js';

/** One recorded request. `stdin` is decoded to text; absent fields were not given. */
export interface RecordedCall {
  cmd: string;
  args: string[];
  stdin?: string;
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
}

/**
 * A scripted answer. Missing fields default to empty output, exit code 0 and no error; a non-zero
 * `exitCode` without `error` gets a {@link CommandExitError} (`exit status <n>`).
 */
export interface ScriptedResult {
  stdout?: string;
  stderr?: string;
  exitCode?: number;
  error?: CommandError;
  durationMs?: number;
}

/** The tail of `text` within `max` UTF-8 bytes (never splitting a character), as the real runner keeps. */
function tailBytes(text: string, max: number | undefined): { text: string; truncated: boolean } {
  if (max === undefined) return { text, truncated: false };
  const buf = Buffer.from(text, 'utf8');
  if (buf.length <= max) return { text, truncated: false };
  let start = buf.length - max;
  while (start < buf.length && ((buf[start] ?? 0) & 0xc0) === 0x80) start++;
  return { text: buf.subarray(start).toString('utf8'), truncated: true };
}

/** A fixed answer, or a function of the request. */
export type Responder =
  | ScriptedResult
  | ((req: RunRequest, call: RecordedCall) => ScriptedResult | Promise<ScriptedResult>);

interface Rule {
  cmd: string;
  match: ((args: readonly string[]) => boolean) | undefined;
  responder: Responder;
  once: boolean;
}

/**
 * A failed run as the real runner reports it: the fake attaches a {@link CommandExitError}
 * (`exit status <code>`, named after the requested command).
 *
 * @param code - Non-zero exit code.
 * @param stderr - Stderr text.
 * @param stdout - Stdout text.
 */
export function exitWith(code: number, stderr = '', stdout = ''): ScriptedResult {
  return { stdout, stderr, exitCode: code };
}

/** Options of {@link FakeCommandRunner}. */
export interface FakeCommandRunnerOptions {
  /** When set, commands outside it reject with {@link CommandNotAllowedError}, like the real runner. */
  allow?: readonly string[];
  /** Answer for requests no rule matches; without it such requests reject (an unscripted call). */
  fallback?: Responder;
}

/** The fake runner. Rules are tried newest first; a `once` rule is consumed by its first match. */
export class FakeCommandRunner implements CommandRunner {
  /** Every request, in order. */
  readonly calls: RecordedCall[] = [];
  private readonly rules: Rule[] = [];
  private readonly opts: FakeCommandRunnerOptions;

  /** @param opts - Allow-list and fallback answer. */
  constructor(opts: FakeCommandRunnerOptions = {}) {
    this.opts = opts;
  }

  /**
   * Answers every matching request with `responder`.
   *
   * @param cmd - Tool name.
   * @param responder - Answer.
   * @param match - Optional predicate on args.
   * @returns `this`, for chaining.
   */
  on(cmd: string, responder: Responder, match?: (args: readonly string[]) => boolean): this {
    this.rules.unshift({ cmd, match, responder, once: false });
    return this;
  }

  /**
   * Answers the next matching request only.
   *
   * @param cmd - Tool name.
   * @param responder - Answer.
   * @param match - Optional predicate on args.
   * @returns `this`, for chaining.
   */
  once(cmd: string, responder: Responder, match?: (args: readonly string[]) => boolean): this {
    this.rules.unshift({ cmd, match, responder, once: true });
    return this;
  }

  /** Every recorded command line as `[cmd, ...args]`. */
  argv(): string[][] {
    return this.calls.map((c) => [c.cmd, ...c.args]);
  }

  /**
   * Records the request and answers it. Streams scripted stdout then stderr through `onOutput`;
   * the result keeps each stream's tail within `maxOutputBytes` and reports `truncated`, as the
   * real runner does.
   * An already-aborted signal yields `Already canceled` (nothing recorded as run, but the call is
   * still recorded).
   *
   * @throws {CommandNotAllowedError} when `allow` is set and excludes `cmd`.
   * @throws {Error} `unscripted command: <argv>` when no rule matches and there is no fallback.
   */
  async run(req: RunRequest): Promise<RunResult> {
    if (this.opts.allow && !this.opts.allow.includes(req.cmd))
      throw new CommandNotAllowedError(req.cmd, this.opts.allow);
    const call: RecordedCall = { cmd: req.cmd, args: [...req.args] };
    if (req.stdin !== undefined) {
      call.stdin = typeof req.stdin === 'string' ? req.stdin : Buffer.from(req.stdin).toString('utf8');
    }
    if (req.cwd !== undefined) call.cwd = req.cwd;
    if (req.env !== undefined) call.env = { ...req.env };
    if (req.timeoutMs !== undefined) call.timeoutMs = req.timeoutMs;
    this.calls.push(call);

    if (req.signal?.aborted) {
      return {
        stdout: '',
        stderr: '',
        exitCode: -1,
        durationMs: 0,
        error: new CommandCanceledError(req.cmd, false, req.signal.reason),
        truncated: { stdout: false, stderr: false },
      };
    }

    const idx = this.rules.findIndex((r) => r.cmd === req.cmd && (r.match === undefined || r.match(req.args)));
    let responder: Responder | undefined;
    if (idx >= 0) {
      const rule = this.rules[idx];
      if (rule?.once) this.rules.splice(idx, 1);
      responder = rule?.responder;
    } else {
      responder = this.opts.fallback;
    }
    if (responder === undefined) throw new Error(`unscripted command: ${[req.cmd, ...req.args].join(' ')}`);

    const scripted = typeof responder === 'function' ? await responder(req, call) : responder;
    if (req.onOutput) {
      if (scripted.stdout) req.onOutput(scripted.stdout, 'stdout');
      if (scripted.stderr) req.onOutput(scripted.stderr, 'stderr');
    }
    // Like the real runner: each stream keeps its tail within `req.maxOutputBytes`.
    const out = tailBytes(scripted.stdout ?? '', req.maxOutputBytes);
    const err = tailBytes(scripted.stderr ?? '', req.maxOutputBytes);
    const stdout = out.text;
    const stderr = err.text;
    let exitCode = scripted.exitCode ?? (scripted.error ? scripted.error.exitCode : 0);
    let error = scripted.error;
    if (error === undefined && exitCode !== 0) error = new CommandExitError(req.cmd, exitCode);
    if (error !== undefined && exitCode === 0) exitCode = error.exitCode;
    const result: RunResult = {
      stdout,
      stderr,
      exitCode,
      durationMs: scripted.durationMs ?? 0,
      truncated: { stdout: out.truncated, stderr: err.truncated },
    };
    if (error !== undefined) result.error = error;
    return result;
  }
}

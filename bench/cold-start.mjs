// Child of the bundles scenario: a fresh Node process, as a Lambda cold start is.
//
//   node cold-start.mjs <bundle.mjs> [<event JSON>]
//     imports one bundled function and calls its handler once: with an empty SQS batch when no
//     event is given (the figure the scenario calls `init`: the function's ports are built, the
//     AWS SDK is not loaded), or with the given SQS event (`firstInvocation`: the record is
//     handled for real, so the SDK loads on its first command).
//   node cold-start.mjs --sdk
//     loads the AWS SDK clients the functions use (S3, SQS) from NODE_PATH, as the Lambda
//     runtime provides them, and nothing else: what a first invocation pays for them alone.
//
// Prints one JSON line holding `coldStart`: { importMs, calledMs, failures } (or { sdkMs }),
// performance.now() readings (ms since this process started); the function's own log lines
// (pino, JSON on stdout) may come before it.
import { createRequire } from 'node:module';

if (process.argv[2] === '--sdk') {
  const require = createRequire(`${process.env.NODE_PATH}/`);
  require('@aws-sdk/client-s3');
  require('@aws-sdk/client-sqs');
  const sdkMs = performance.now();
  process.stdout.write(`${JSON.stringify({ coldStart: { sdkMs } })}\n`);
} else {
  const bundle = process.argv[2];
  const event = process.argv[3] ? JSON.parse(process.argv[3]) : { Records: [] };
  const mod = await import(bundle);
  const importMs = performance.now();
  const out = await mod.handler(event, { awsRequestId: 'bench', getRemainingTimeInMillis: () => 170_000 });
  const calledMs = performance.now();
  const failures = out?.batchItemFailures?.length ?? -1;
  process.stdout.write(`${JSON.stringify({ coldStart: { importMs, calledMs, failures } })}\n`);
}

// Child of the bundles scenario: a fresh Node process that imports one bundled function and
// calls its handler once with an empty SQS batch (the first invocation initializes the
// function's ports: kubeconfig registry, S3 and SQS clients, logger). Prints one JSON line:
// { importMs, firstCallMs } as performance.now() readings (ms since this process started).
// Usage: node cold-start.mjs <bundle.mjs>
const bundle = process.argv[2];
const mod = await import(bundle);
const importMs = performance.now();
const out = await mod.handler({ Records: [] }, { awsRequestId: 'bench' });
const firstCallMs = performance.now();
process.stdout.write(`${JSON.stringify({ importMs, firstCallMs, failures: out?.batchItemFailures?.length ?? -1 })}\n`);

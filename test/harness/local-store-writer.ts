/**
 * A writer process of the local store's cross-process compare-and-swap test:
 * `local-store-writer.ts <rootDir> <key> <name> <instances> <entries>` appends `<name>-<i>-<n>`
 * (n < entries) to the JSON array at `key` from `instances` LocalDirStore instances at once, then
 * prints the `putIfMatch` results as one JSON line. Exits 1 with the error on stderr on a throw.
 */
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { appendUnderCas } from './store-cas-append.js';

const [rootDir, key, name, instances, entries] = process.argv.slice(2);
if (!rootDir || !key || !name)
  throw new Error('usage: local-store-writer.ts <rootDir> <key> <name> <instances> <entries>');
const results = await Promise.all(
  Array.from({ length: Number(instances) }, (_, i) =>
    appendUnderCas(
      new LocalDirStore(rootDir),
      key,
      Array.from({ length: Number(entries) }, (_, n) => `${name}-${i}-${n}`),
    ),
  ),
);
process.stdout.write(`${JSON.stringify(results.flat())}\n`);

/**
 * Bundles the forwarder program (`events/forwarder/main.ts`) with the project's one esbuild
 * recipe (`layers/bundle.ts`) into `dist/forwarder/main.mjs`, the file the container image runs
 * (`infra/forwarder/Containerfile`). Usage: `npm run build:forwarder [-- <outfile>]`.
 */
import path from 'node:path';
import { bundleEntry } from '../layers/bundle.js';

const root = path.join(import.meta.dirname, '..');
const outfile = path.resolve(process.argv[2] ?? path.join(root, 'dist', 'forwarder', 'main.mjs'));
const bytes = await bundleEntry(path.join(root, 'events', 'forwarder', 'main.ts'), outfile);
process.stderr.write(`forwarder bundle: ${outfile} (${Math.round(bytes / 1024)} KiB)\n`);

// bench/tokenizer/hf_bench.mjs — HF `tokenizers` encode speed through its Node binding (the
// npm package `tokenizers`: the same Rust library as the Python package, prebuilt), for
// machines without the Python package.  Same output lines as hf_bench.py and tok-bench:
//
//   node bench/tokenizer/hf_bench.mjs [--ids-dir DIR] [-r REPEATS] MODEL_DIR FILE...
//
//   whole     encode(file text), one call
//   lines     encode(line) for each line, one call at a time (each call also pays the
//             binding's async hop to a worker thread: an upper bound on HF's per-line cost)
//   lines-Nt  encodeBatch(lines) on N rayon threads (RAYON_NUM_THREADS or all CPUs)
// With --ids-dir, compares the ids of "whole" with DIR/<file>.ids written by tok-bench.
// The package: `npm install --prefix bench/tokenizer tokenizers@0.23.2` (run-on-device.sh
// does it when Python lacks `tokenizers`).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const require = createRequire(path.join(path.dirname(fileURLToPath(import.meta.url)), 'x.js'));
const { Tokenizer } = require('tokenizers');
const version = require('tokenizers/package.json').version;

const args = process.argv.slice(2);
let idsDir = null, repeats = 3;
while (args.length && args[0].startsWith('-')) {
  const a = args.shift();
  if (a === '--ids-dir') idsDir = args.shift();
  else if (a === '-r' || a === '--repeats') repeats = Number(args.shift());
  else { console.error(`hf_bench.mjs: unknown option ${a}`); process.exit(2); }
}
if (args.length < 2) {
  console.error('usage: node hf_bench.mjs [--ids-dir DIR] [-r REPEATS] MODEL_DIR FILE...');
  process.exit(2);
}
const [modelDir, ...files] = args;
const now = () => Number(process.hrtime.bigint()) / 1e9;
const pad = (s, n) => String(s).padEnd(n);
const num = (x, w, d) => x.toFixed(d).padStart(w);

async function bestOf(fn) {
  let best = Infinity, out;
  for (let i = 0; i < repeats; i++) {
    const t0 = now();
    out = await fn();
    best = Math.min(best, now() - t0);
  }
  return [best, out];
}

const opts = { addSpecialTokens: false };
let t0 = now();
const tok = Tokenizer.fromFile(path.join(modelDir, 'tokenizer.json'));
console.log(`${pad('load', 12)} ${pad('', 9)} ${num(now() - t0, 8, 3)} s    (${modelDir}; npm tokenizers ${version})`);
const threads = Number(process.env.RAYON_NUM_THREADS || 0) || os.cpus().length;
let status = 0;
for (const file of files) {
  const name = path.basename(file);
  const raw = readFileSync(file);
  const text = raw.toString('utf8');
  let [t, enc] = await bestOf(() => tok.encode(text, null, opts));
  const ids = enc.getIds();
  console.log(`${pad(name, 12)} ${pad('whole', 9)} ${num(raw.length / t / 1e6, 8, 2)} MB/s  ${String(raw.length).padStart(9)} bytes ${String(ids.length).padStart(8)} ids  ${t.toFixed(3)} s`);
  if (idsDir) {
    const buf = readFileSync(path.join(idsDir, `${name}.ids`));
    const ours = new Int32Array(buf.buffer, buf.byteOffset, buf.length / 4);
    let diff = -1;
    const n = Math.min(ours.length, ids.length);
    for (let i = 0; i < n && diff < 0; i++) if (ours[i] !== ids[i]) diff = i;
    if (diff < 0 && ours.length !== ids.length) diff = n;
    if (diff < 0) {
      console.log(`${pad(name, 12)} ids identical to atlas (${ids.length} ids)`);
    } else {
      console.log(`${pad(name, 12)} IDS DIFFER from atlas at index ${diff} (atlas ${ours.length} ids, HF ${ids.length})`);
      status = 1;
    }
  }
  const lines = text.split('\n');
  const nBytes = raw.length - (lines.length - 1);
  [t] = await bestOf(async () => { for (const l of lines) await tok.encode(l, null, opts); });
  console.log(`${pad(name, 12)} ${pad('lines', 9)} ${num(nBytes / t / 1e6, 8, 2)} MB/s  ${String(nBytes).padStart(9)} bytes  ${t.toFixed(3)} s  (${lines.length} lines)`);
  [t] = await bestOf(() => tok.encodeBatch(lines, opts));
  console.log(`${pad(name, 12)} ${pad(`lines-${threads}t`, 9)} ${num(nBytes / t / 1e6, 8, 2)} MB/s  ${String(nBytes).padStart(9)} bytes  ${t.toFixed(3)} s  (${lines.length} lines)`);
}
process.exit(status);

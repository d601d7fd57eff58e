// bench/serve/loadgen.py against a real server (the default model on the CPU), so that the
// serving benchmark's client does not rot between GPU sessions: exact token counts, the
// roofline it prints against the formula worked here, the prefix hit rate of a shared prefix
// from /metrics, drawn lengths, Poisson levels, sampled mode, and failures counted.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer } from './lib.mjs';

const LOADGEN = path.join(path.dirname(new URL(import.meta.url).pathname), '..', '..', 'bench', 'serve', 'loadgen.py');
const HAS_PY = spawnSync('python3', ['-c', 'import sys; sys.exit(sys.version_info < (3, 8))']).status === 0;
// the default model's shape (8 layers, hidden 256, heads 8/4 x 32, ffn 704, vocab 4096)
const SHAPE = { params: 8 * (256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 704 + 2 * 256) + 256,
  lm_head: 4096 * 256, layers: 8, attn_dim: 256, matrix_tflops: 0.05 };

let srv, dir;
before(async () => {
  srv = await startServer(['--device', 'cpu', '--parallel', '4']);
  dir = mkdtempSync(path.join(tmpdir(), 'atlas-loadgen-'));
});
after(async () => {
  rmSync(dir, { recursive: true, force: true });
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

// Runs loadgen.py with ARGS; its exit status, output and --json report.
let runs = 0;
function loadgen(args) {
  const json = path.join(dir, `r${runs++}.json`);
  return new Promise((resolve) => {
    const p = spawn('python3', [LOADGEN, '--url', srv.base, '--model', 'default', '--id-range', '100-4000',
      '--json', json, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { out += d; });
    p.on('exit', (code) => {
      let report = null;
      try { report = JSON.parse(readFileSync(json, 'utf8')); } catch { /* none written */ }
      resolve({ code, out, report });
    });
  });
}

test('fixed, greedy: exact tokens, and the roofline by the stated formula', { skip: !HAS_PY && 'no python3' }, async () => {
  const r = await loadgen(['--concurrency', '2', '--requests', '4', '--input-len', '8', '--output-len', '5',
    '--params', String(SHAPE.params), '--lm-head', String(SHAPE.lm_head), '--layers', '8', '--hidden', '256',
    '--matrix-tflops', '0.05']);
  assert.equal(r.code, 0, r.out);
  const lv = r.report.levels[0];
  assert.equal(lv.mode, 'greedy');
  assert.deepEqual([lv.requests, lv.failed, lv.prompt_tokens, lv.output_tokens], [4, 0, 32, 20], r.out);
  assert.equal(lv.preemptions, 0);
  // per request: 8 x 2P + 5 x 2(P + lm_head) + 4 x 8 x 256 x (8*9/2 + 5*8 + 5*6/2)
  const flops = 4 * (8 * 2 * SHAPE.params + 5 * 2 * (SHAPE.params + SHAPE.lm_head) + 4 * 8 * 256 * (36 + 40 + 15));
  const t = flops / 0.05e12;
  assert.ok(Math.abs(lv.roofline_s - t) < 1e-9 * t, `${lv.roofline_s} vs ${t}`);
  assert.ok(Math.abs(lv.roofline_ratio - t / lv.wall_s) < 1e-9, r.out);
  assert.ok(Math.abs(lv.roofline_output_tok_s - 20 / t) < 1e-6 * (20 / t), r.out);
  assert.ok(lv.output_tok_s > 0 && lv.total_tok_s > lv.output_tok_s, r.out);
  assert.match(r.out, /roofline FLOPs = prompt tokens x 2 x P/);
});

test('shared prefix: the hit rate is the prefix blocks the later requests found', { skip: !HAS_PY && 'no python3' }, async () => {
  // one client: each request ends (and leaves its blocks to the cache) before the next; the
  // 64-token prefix is 4 full blocks of 16, found by the 2nd and 3rd requests
  const r = await loadgen(['--workload', 'shared-prefix', '--prefix-len', '64', '--input-len', '8', '--output-len', '3',
    '--concurrency', '1', '--requests', '3', '--seed', '5']);
  assert.equal(r.code, 0, r.out);
  const lv = r.report.levels[0];
  assert.equal(lv.prompt_tokens, 3 * 72);
  assert.deepEqual([lv.prefix_queries, lv.prefix_hits], [216, 128], r.out);
  assert.ok(Math.abs(lv.prefix_hit_rate - 128 / 216) < 1e-12);
});

test('mixed, sampled: seeded lengths in range', { skip: !HAS_PY && 'no python3' }, async () => {
  const a = await loadgen(['--workload', 'mixed', '--mixed-input', '4-200', '--mixed-output', '2-20',
    '--concurrency', '3', '--requests', '6', '--temperature', '0.7', '--top-p', '0.95', '--seed', '9']);
  assert.equal(a.code, 0, a.out);
  const la = a.report.levels[0];
  assert.equal(la.mode, 'sampled');
  assert.deepEqual(a.report.sampling, { temperature: 0.7, top_p: 0.95 });
  assert.equal(la.failed, 0);
  assert.ok(la.prompt_tokens >= 6 * 4 && la.prompt_tokens <= 6 * 200, a.out);
  assert.ok(la.output_tokens >= 6 * 2 && la.output_tokens <= 6 * 20, a.out);
});

test('Poisson levels, and a failing request counted, not fatal', { skip: !HAS_PY && 'no python3' }, async () => {
  const p = await loadgen(['--rate', '40,80', '--requests', '5', '--input-len', '8', '--output-len', '4', '--seed', '11']);
  assert.equal(p.code, 0, p.out);
  assert.deepEqual(p.report.levels.map((l) => [l.rate, l.requests, l.failed, l.output_tokens]),
    [[40, 5, 0, 20], [80, 5, 0, 20]], p.out);
  // the default model's context is 1,024 tokens: 1,000 + 100 is refused with a 400
  const f = await loadgen(['--concurrency', '2', '--requests', '3', '--input-len', '1000', '--output-len', '100']);
  assert.equal(f.code, 1, f.out);
  assert.deepEqual([f.report.levels[0].requests, f.report.levels[0].failed], [3, 3]);
  assert.match(f.report.levels[0].failures[0], /HTTP 400: .*context/);
});

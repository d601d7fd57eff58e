// --max-resident auto: three models of different settings under one memory budget.  The
// pool of a model without kv_memory is its share of the budget; as many models load at
// start as fit; a swap releases only what makes room, the least recently used idle model
// first and a pinned one never; /v1/models and /metrics tell each model's state and bytes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, readdirSync, statSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, getJSON, DATA, DEFAULT } from './lib.mjs';

const MiB = 1 << 20;
const BUDGET = 384 * MiB;
const tmp = mkdtempSync(path.join(os.tmpdir(), 'atlas-resident-'));
const file = path.join(tmp, 'models.json');
const DEF = DEFAULT.split('=')[1];
// KV bytes a token (f32 on the CPU with --cpu-activations fp32): tiny-llama3 128, tiny-qwen3 512, the default model 8192
const MODELS = [
  { name: 'small', dir: path.join(DATA, 'tiny-llama3'), ctx_size: 65536, parallel: 32, kv_memory: 0.22 },
  { name: 'qwen', dir: path.join(DATA, 'tiny-qwen3'), ctx_size: 4096, parallel: 64, kv_memory: 0.1 },
  { name: 'def', dir: DEF, ctx_size: 1024, parallel: 32, pinned: true }, // its pool: a share
];
writeFileSync(file, JSON.stringify({ models: MODELS }));

// the weights as the engine counts them before a load: the *.safetensors files' bytes
const weights = (dir) => readdirSync(dir).filter((f) => f.endsWith('.safetensors') && f !== 'reference.safetensors')
  .reduce((n, f) => n + statSync(path.join(dir, f)).size, 0);

let srv;
before(async () => {
  srv = await startServer(['--models-preset', file, '--max-resident', 'auto', '--memory-budget',
    String(BUDGET / (1 << 30)), '--keep-alive', '-1', '--device', 'cpu', '--cpu-activations', 'fp32']);
});
after(async () => {
  const r = await srv.stop();
  rmSync(tmp, { recursive: true, force: true });
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const models = async () => Object.fromEntries((await getJSON(srv.base, '/v1/models')).json.data.map((m) => [m.id, m]));
const states = async () => Object.fromEntries(Object.entries(await models()).map(([k, v]) => [k, v.state]));
const complete = (model) => postJSON(srv.base, '/v1/completions', { model, prompt: 'Hello', max_tokens: 2, temperature: 0 });
const metric = (text, name) => {
  const m = text.match(new RegExp(`^${name.replace(/[{}"=,]/g, (c) => `\\${c}`)} (\\S+)$`, 'm'));
  assert.ok(m, `no ${name} in /metrics`);
  return Number(m[1]);
};

test('a pool not set is an even share of what the budget leaves after the weights', async () => {
  const m = await models();
  // three models fit by weight, each with a 64 MiB workspace reserve on the CPU
  const w = weights(MODELS[0].dir) + weights(MODELS[1].dir) + weights(DEF);
  const share = Math.floor((BUDGET - w - 3 * 64 * MiB) / 3);
  const block = 16 * 8192;
  assert.equal(m.def.settings.kv_memory, Math.floor(share / block) * block);
  assert.equal(m.def.settings.ctx_size, 1024, 'the share holds a whole context');
  // the others have what they asked, in whole blocks of 16 tokens
  assert.equal(m.small.settings.kv_memory, Math.floor(0.22 * 1024 * MiB / (16 * 128)) * 16 * 128);
  assert.equal(m.qwen.settings.kv_memory, Math.floor(0.1 * 1024 * MiB / (16 * 512)) * 16 * 512);
  for (const id of ['small', 'qwen', 'def']) assert.ok(m[id].memory_bytes > m[id].settings.kv_memory, id);
  const total = m.small.memory_bytes + m.qwen.memory_bytes + m.def.memory_bytes;
  assert.ok(total > BUDGET, 'the three do not fit together');
  assert.ok(m.small.memory_bytes + m.qwen.memory_bytes <= BUDGET, 'any two do');
});

test('as many load at start as fit; the one that does not waits for its first request', async () => {
  assert.deepEqual(await states(), { small: 'resident', qwen: 'resident', def: 'unloaded' });
  assert.match(srv.log(), /model def: not loaded at start: it does not fit the memory budget/);
  assert.match(srv.log(), /memory used [\d.]+ GiB by 2 loaded model\(s\) of 3, budget 0\.38 GiB$/m);
  const text = (await getJSON(srv.base, '/metrics')).text;
  assert.equal(metric(text, 'atlas_memory_budget_bytes'), BUDGET);
  assert.equal(metric(text, 'atlas_model_state{model_name="def",state="unloaded"}'), 1);
  assert.equal(metric(text, 'atlas_model_state{model_name="small",state="resident"}'), 1);
  assert.equal(metric(text, 'atlas_model_resident_bytes{model_name="def"}'), 0);
  assert.equal(metric(text, 'atlas_model_swaps_total'), 0);
});

test('a swap releases the least recently used idle model, and only as much as makes room', async () => {
  assert.equal((await complete('small')).status, 200); // qwen is now the least recently used
  const t0 = Date.now();
  const r = await complete('def');
  assert.equal(r.status, 200, r.text);
  assert.ok(Date.now() - t0 < 5000, 'an idle model goes at once');
  assert.deepEqual(await states(), { small: 'resident', qwen: 'unloaded', def: 'resident' });
  assert.match(srv.log(), /model qwen: released in [\d.]+ s .*to make room for def/);
  const m = await models();
  const text = (await getJSON(srv.base, '/metrics')).text;
  assert.equal(metric(text, 'atlas_model_swaps_total'), 1);
  assert.ok(metric(text, 'atlas_model_swap_seconds_total') > 0);
  assert.equal(metric(text, 'atlas_model_resident_bytes{model_name="def"}'), m.def.resident_bytes);
  assert.equal(metric(text, 'atlas_model_resident_bytes{model_name="qwen"}'), 0);
  assert.ok(m.def.resident_bytes > 0 && m.def.last_load_s > 0, JSON.stringify(m.def));
  assert.ok(m.small.resident_bytes + m.def.resident_bytes <= BUDGET);
});

test('a pinned model stays though it is the least recently used', async () => {
  assert.equal((await complete('small')).status, 200); // def (pinned) is now the older one
  const r = await complete('qwen');
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(await states(), { small: 'unloaded', qwen: 'resident', def: 'resident' });
  const text = (await getJSON(srv.base, '/metrics')).text;
  assert.equal(metric(text, 'atlas_model_swaps_total'), 2);
  assert.equal(metric(text, 'atlas_model_state{model_name="small",state="unloaded"}'), 1);
});

test('--max-resident takes a count or auto, and nothing else', async () => {
  const { spawnSync } = await import('node:child_process');
  const r = spawnSync(process.env.ATLAS_BIN, ['serve', '--port', '0', '--max-resident', 'some'], { encoding: 'utf8', timeout: 10000 });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /--max-resident: 'some' is neither a count in 1..1024 nor auto/);
  const h = spawnSync(process.env.ATLAS_BIN, ['serve', '--help'], { encoding: 'utf8' });
  assert.match(h.stdout, /--max-resident N\|auto/);
  assert.match(h.stdout, /--memory-budget GIB/);
});

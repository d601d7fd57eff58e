// --kv-cache-dtype fp8 and the preset's kv_dtype: a model with an FP8 KV cache holds twice the
// tokens of the same model with a bf16 one in the same KV memory, says so in /v1/models and
// the start banner, and answers; vLLM's alias fp8_e4m3 means fp8, and fp8_e5m2 is refused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, getJSON, BIN, DATA } from './lib.mjs';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'atlas-kvfp8-'));
const dir = path.join(DATA, 'tiny-llama3');
const file = path.join(tmp, 'models.json');
// 128 KiB of KV each (64 and 32 bytes a token): the memory, not the context, bounds both pools
writeFileSync(file, JSON.stringify({ models: [
  { name: 'b', dir, kv_dtype: 'bf16', kv_memory: 1 / 8192, ctx_size: 256, load: true },
  { name: 'f', dir, kv_dtype: 'fp8_e4m3', kv_memory: 1 / 8192, ctx_size: 256, load: true },
] }));

let srv;
before(async () => {
  srv = await startServer(['--models-preset', file, '--device', 'cpu', '--max-resident', '2']);
});
after(async () => {
  const r = await srv.stop();
  rmSync(tmp, { recursive: true, force: true });
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

test('an FP8 pool holds twice the tokens of a bf16 one in the same memory', async () => {
  const m = Object.fromEntries((await getJSON(srv.base, '/v1/models')).json.data.map((x) => [x.id, x]));
  assert.equal(m.b.settings.kv_dtype, 'bf16');
  assert.equal(m.f.settings.kv_dtype, 'fp8');
  assert.equal(m.f.settings.kv_memory, m.b.settings.kv_memory);
  assert.ok(m.b.settings.kv_tokens > 0 && m.b.settings.kv_tokens < 256 * 32, JSON.stringify(m.b.settings));
  assert.equal(m.f.settings.kv_tokens, 2 * m.b.settings.kv_tokens);
  const banner = srv.log();
  assert.match(banner, new RegExp(`model f: dir .*kv ${m.f.settings.kv_tokens} tokens of fp8, context`));
  assert.match(banner, new RegExp(`model b: dir .*kv ${m.b.settings.kv_tokens} tokens of bf16, context`));
});

test('/metrics labels each pool with its element type', async () => {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  assert.match(text, /^atlas_cache_config_info\{model_name="f",block_size="\d+",num_gpu_blocks="\d+",cache_dtype="fp8"\} 1$/m, text);
  assert.match(text, /^atlas_cache_config_info\{model_name="b",block_size="\d+",num_gpu_blocks="\d+",cache_dtype="bf16"\} 1$/m);
});

test('the FP8 model answers', async () => {
  for (const model of ['b', 'f']) {
    const r = await postJSON(srv.base, '/v1/completions', { model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.completion_tokens, 8, r.text);
  }
});

test('the flag refuses fp8_e5m2 and unknown types, naming what it takes', () => {
  for (const v of ['fp8_e5m2', 'int8']) {
    const r = spawnSync(BIN, ['serve', '--port', '0', '--kv-cache-dtype', v, '--model', dir], { encoding: 'utf8', timeout: 10000 });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`--kv-cache-dtype: KV cache dtype '${v}'.*auto, bf16, fp8, fp8_e4m3`));
  }
});

test('atlas info sizes the cache the flag asks for', () => {
  const info = (kv) => {
    const r = spawnSync(BIN, ['info', '-m', dir, '--device', 'cpu', '--kv-cache-dtype', kv], { encoding: 'utf8', timeout: 10000 });
    assert.equal(r.status, 0, r.stderr);
    const m = r.stdout.match(/^kv cache: +(\d+) blocks of (\d+) tokens, ([\d.]+) MiB \(([^)]+)\)$/m);
    assert.ok(m, r.stdout);
    return m;
  };
  const b = info('bf16'), f = info('fp8');
  assert.equal(b[4], 'bf16');
  assert.equal(f[4], 'fp8 e4m3');
  assert.equal(f[1], b[1], 'the same blocks');
  // MiB with one decimal: half the bytes, to the printed precision
  assert.ok(Number(f[3]) > 0 && Math.abs(Number(f[3]) * 2 - Number(b[3])) <= 0.1, `${f[0]} / ${b[0]}`);
});

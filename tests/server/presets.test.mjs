// --models-preset: three models with different settings in one server; each setting must
// take effect (context, KV memory, template and tool-call format over the flags', keep-alive
// from the file, a request and Ollama's route, pinned,
// load at start), and a bad file must stop the start naming what is wrong.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, getJSON, waitFor, BIN, DATA, DEFAULT } from './lib.mjs';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'atlas-presets-'));
const preset = (models) => {
  const f = path.join(tmp, `p${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(f, JSON.stringify({ models }));
  return f;
};
// a template of the file's own (named relative to it) and one the flag gives every model
writeFileSync(path.join(tmp, 'plain.jinja'), '{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}');
const flagTemplate = path.join(tmp, 'flag.jinja');
writeFileSync(flagTemplate, 'FLAG {{ messages[0].content }}');
const MODELS = [
  { name: 'small', dir: path.join(DATA, 'tiny-llama3'), aliases: ['gpt-small'], ctx_size: 64,
    parallel: 2, keep_alive: '1s', kv_dtype: 'auto', chat_template: 'plain.jinja' },
  { name: 'big', dir: path.join(DATA, 'tiny-qwen3'), ctx_size: 512, pinned: true, load: true,
    tool_call_format: 'hermes', kv_dtype: 'f32' },
  { name: 'def', dir: DEFAULT.split('=')[1], ctx_size: 256, batch_tokens: 64, load: false,
    kv_memory: 8 / 1024 },
];

let srv;
before(async () => {
  // fp32 activations: the CPU's KV cache in f32, which the models' kv_dtype settings name
  srv = await startServer(['--models-preset', preset(MODELS), '--max-resident', '2', '--keep-alive', '-1',
    '--chat-template', flagTemplate, '--tool-call-format', 'none', '--cpu-activations', 'fp32']);
});
after(async () => {
  const r = await srv.stop();
  rmSync(tmp, { recursive: true, force: true });
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const models = async () => Object.fromEntries((await getJSON(srv.base, '/v1/models')).json.data.map((m) => [m.id, m]));
const complete = (model, extra = {}) => postJSON(srv.base, '/v1/completions', { model, prompt: 'Hello', max_tokens: 2, temperature: 0, ...extra });

test('each model is served with its own settings, shown by /v1/models', async () => {
  const m = await models();
  assert.deepEqual([m.small.settings.ctx_size, m.big.settings.ctx_size, m.def.settings.ctx_size], [64, 512, 256]);
  assert.equal(m.small.settings.parallel, 2);
  assert.equal(m.small.settings.keep_alive, 1);
  assert.equal(m.def.settings.keep_alive, -1, 'the flag is the default');
  assert.equal(m.def.settings.batch_tokens, 64);
  assert.equal(m.big.settings.pinned, true);
  assert.equal(m.small.settings.kv_dtype, 'f32');
  assert.equal(m.big.settings.kv_dtype, 'f32', 'named, and the backend\'s');
  // def's 8 MiB of KV at 8 KiB a token (f32, 8 layers, 4 KV heads of 32): 1,024 tokens
  assert.equal(m.def.settings.kv_memory, 8 << 20);
  assert.equal(m.def.settings.kv_tokens, 1024);
  assert.equal(m.small.settings.kv_tokens, 128, 'parallel 2 x ctx 64 caps the pool');
  assert.deepEqual([m.small.settings.tool_call_format, m.big.settings.tool_call_format,
    m.def.settings.tool_call_format], ['none', 'hermes', 'none'], 'the file wins over the flag');
  assert.deepEqual([m.small.settings.chat_template, m.big.settings.chat_template], ['operator', 'operator']);
  // load at start: only the model whose "load" is true
  assert.equal(m.big.state, 'resident');
  assert.equal(m.small.state, 'unloaded');
  assert.equal(m.def.state, 'unloaded');
  assert.match(srv.log(), /model big: loaded in/);
});

test('a template from the file wins over the flag\'s, which the other models render', async () => {
  const messages = [{ role: 'user', content: 'Hi' }];
  const small = await postJSON(srv.base, '/apply-template', { model: 'small', messages });
  assert.equal(small.status, 200, small.text);
  assert.equal(small.json.prompt, '<<user>>Hi');
  const big = await postJSON(srv.base, '/apply-template', { model: 'big', messages });
  assert.equal(big.json.prompt, 'FLAG Hi');
});

test('a request past one model\'s smaller context is a 400; the larger one takes it', async () => {
  const small = await complete('small', { max_tokens: 100 });
  assert.equal(small.status, 400, small.text);
  assert.match(small.json.error.message, /64/);
  const big = await complete('big', { max_tokens: 100, ignore_eos: true });
  assert.equal(big.status, 200, big.text);
  assert.equal(big.json.usage.completion_tokens, 100);
});

test('keep-alive from the file releases an idle model after about a second', async () => {
  const r = await complete('gpt-small'); // the alias from the file
  assert.equal(r.status, 200, r.text);
  const t0 = Date.now();
  await waitFor(async () => (await models()).small.state === 'unloaded', { timeoutMs: 5000, everyMs: 50 });
  const dt = Date.now() - t0;
  assert.ok(dt >= 700 && dt < 3000, `released after ${dt} ms`);
  assert.match(srv.log(), /model small: released in [\d.]+ s .*idle past its keep-alive/);
  const health = (await getJSON(srv.base, '/health')).json;
  assert.equal(health.model_states.find((x) => x.id === 'small').state, 'unloaded', JSON.stringify(health));
});

test('a pinned model is never the one evicted; a request keep_alive -1 keeps its model', async () => {
  // small comes back, kept by the request; big (pinned) is now the least recently used
  const r = await complete('small', { keep_alive: -1 });
  assert.equal(r.status, 200, r.text);
  await new Promise((res) => setTimeout(res, 1500)); // past the file's 1 s
  let m = await models();
  assert.equal(m.small.state, 'resident', 'the request\'s keep_alive holds');
  assert.equal(m.small.settings.keep_alive_now, -1);
  const d = await complete('def');
  assert.equal(d.status, 200, d.text);
  m = await models();
  assert.equal(m.big.state, 'resident', 'pinned stays');
  assert.equal(m.def.state, 'resident');
  assert.equal(m.small.state, 'unloaded', 'the unpinned one made room');
  assert.match(srv.log(), /model small: released in [\d.]+ s .*to make room for def/);
});

test('Ollama\'s keep_alive is honoured beyond 0: "1s" releases the model a second after', async () => {
  const r = await postJSON(srv.base, '/api/generate', { model: 'def', prompt: 'Hi', stream: false, keep_alive: '1s', options: { num_predict: 2 } });
  assert.equal(r.status, 200, r.text);
  const m = await models();
  assert.equal(m.def.state, 'resident');
  assert.equal(m.def.settings.keep_alive_now, 1);
  const ps = (await getJSON(srv.base, '/api/ps')).json.models.find((x) => x.name.startsWith('def'));
  assert.ok(Date.parse(ps.expires_at) - Date.now() < 5000, ps.expires_at);
  await waitFor(async () => (await models()).def.state === 'unloaded', { timeoutMs: 5000, everyMs: 50 });
  const bad = await complete('big', { keep_alive: 'soon' });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'keep_alive');
});

test('a bad models file stops the start, naming the model and the setting', () => {
  const run = (models) => spawnSync(BIN, ['serve', '--port', '0', '--models-preset', preset(models)], { encoding: 'utf8', timeout: 10000 });
  let r = run([{ ...MODELS[0], kv_dtype: 'q8_0' }]);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /models\[0\]\.kv_dtype: 'q8_0' is not a KV cache type/);
  // f32, which only the CPU's fp32 activations give: refused naming the model, not served as bf16
  r = spawnSync(BIN, ['serve', '--port', '0', '--device', 'cpu', '--cpu-activations', 'bf16', '--models-preset',
    preset([{ ...MODELS[0], kv_dtype: 'f32' }])], { encoding: 'utf8', timeout: 10000 });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /model 'small': kv_dtype f32: the KV cache on the CPU is bf16/);
  r = run([{ ...MODELS[0], kv_dtype: 'fp8_e5m2' }]);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /models\[0\]\.kv_dtype: 'fp8_e5m2' is not a KV cache type/);
  r = run([MODELS[1], { dir: MODELS[0].dir, ctx: 5 }]);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /models\[1\]\.ctx: unknown setting/);
  r = run([{ name: 'x', dir: MODELS[0].dir, keep_alive: 'soon' }]);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /models\[0\]\.keep_alive/);
  r = run([{ name: 'x', dir: MODELS[0].dir, tool_call_format: 'xml' }]);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /models\[0\]\.tool_call_format: .*xml.*hermes/);
  r = run([{ name: 'x', dir: MODELS[0].dir, chat_template: 'missing.jinja' }]);
  assert.notEqual(r.status, 0, r.stderr);
  assert.match(r.stderr, /missing\.jinja/);
});

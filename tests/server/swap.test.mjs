// 50 swaps with --max-resident 1: requests for both fixture models arrive together, round
// after round; every answer must equal the answer of its model run alone, none may fail,
// and the server's memory must stay flat once warm.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, copyFileSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, greedy, postJSON, getJSON, LLAMA, QWEN, DATA } from './lib.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--model', LLAMA, '--model', QWEN, '--max-resident', '1', '--parallel', '8']);
  client = srv.client();
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const loads = async () => Number((await (await fetch(`${srv.base}/metrics`)).text()).match(/atlas_model_loads_total (\d+)/)[1]);
const ask = async (model, i) => (await client.chat.completions.create(greedy(model, `swap prompt ${i % 3}`, { max_tokens: 6 }))).choices[0].message.content;

test('50 swaps under concurrent load: all answers right, memory stable', async () => {
  const expected = {};
  for (const model of ['llama', 'qwen'])
    for (let k = 0; k < 3; k++) expected[`${model}/${k}`] = await ask(model, k);
  const loads0 = await loads();
  let rss10 = 0;
  for (let round = 0; round < 50; round++) {
    // both models wanted at once: the resident one serves, then the other is swapped in
    const order = round % 2 ? ['qwen', 'llama', 'qwen'] : ['llama', 'qwen', 'llama'];
    const got = await Promise.all(order.map((m, j) => ask(m, round + j).then((t) => [m, (round + j) % 3, t])));
    for (const [m, k, t] of got) assert.equal(t, expected[`${m}/${k}`], `round ${round} ${m}`);
    if (round === 10) rss10 = srv.rssKiB();
  }
  const swaps = (await loads()) - loads0;
  assert.ok(swaps >= 50, `only ${swaps} loads in 50 rounds`);
  const rss50 = srv.rssKiB();
  assert.ok(rss50 - rss10 < 32 * 1024, `RSS grew from ${rss10} KiB to ${rss50} KiB`);
  // by hand: unload, then load
  const un = await postJSON(srv.base, '/v1/models/qwen/unload', {});
  assert.equal(un.status, 200, un.text);
  assert.equal(un.json.resident, false);
  const ld = await postJSON(srv.base, '/v1/models/qwen/load', {});
  assert.equal(ld.status, 200, ld.text);
  assert.equal(ld.json.resident, true);
  assert.equal((await postJSON(srv.base, '/v1/models/nope/load', {})).status, 404);
  console.log(`swaps: ${swaps}, RSS ${rss10} -> ${rss50} KiB`);
});

// A served model whose tokenizer.json is broken: its files are at fault, not the client's
// request, so a 503 (not a 400), /health "degraded" with its last error, the others served.
test('a model whose tokenizer cannot be read is unavailable, not a bad request', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'atlas-badtok-'));
  for (const f of ['config.json', 'tokenizer_config.json', 'model.safetensors'])
    copyFileSync(path.join(DATA, 'tiny-llama3', f), path.join(dir, f));
  writeFileSync(path.join(dir, 'tokenizer.json'), '{"model": ');
  const s = await startServer(['--model', LLAMA, '--model', `badtok=${dir}`]);
  try {
    const bad = await postJSON(s.base, '/v1/chat/completions', greedy('badtok', 'hi'));
    assert.equal(bad.status, 503, bad.text);
    assert.equal(bad.json.error.code, 'model_unavailable');
    assert.match(bad.json.error.message, /badtok.*tokenizer\.json/);
    assert.ok(!bad.json.error.message.includes(dir), bad.json.error.message);
    const h = await getJSON(s.base, '/health');
    assert.equal(h.json.status, 'degraded', JSON.stringify(h.json));
    const st = h.json.model_states.find((m) => m.id === 'badtok');
    assert.equal(st.state, 'failed', JSON.stringify(st));
    assert.match(st.last_error, /tokenizer\.json/);
    const ok = await s.client().chat.completions.create(greedy('llama', 'hi', { max_tokens: 2 }));
    assert.equal(ok.usage.completion_tokens, 2);
  } finally {
    const r = await s.stop();
    rmSync(dir, { recursive: true, force: true });
    assert.equal(r.code, 0, s.log());
  }
});

test('a model that fails to load errors its requests and leaves the server serving', async () => {
  // a checkpoint whose weights file is cut short: config and tokenizer are fine
  const dir = mkdtempSync(path.join(os.tmpdir(), 'atlas-broken-'));
  for (const f of ['config.json', 'tokenizer.json', 'tokenizer_config.json'])
    copyFileSync(path.join(DATA, 'tiny-llama3', f), path.join(dir, f));
  writeFileSync(path.join(dir, 'model.safetensors'), Buffer.from([8, 0, 0, 0, 0, 0, 0, 0, 123]));
  const s = await startServer(['--model', LLAMA, '--model', `broken=${dir}`, '--max-resident', '1']);
  try {
    // the healthy model is resident; the broken one's checkpoint is checked before it is evicted
    await s.client().chat.completions.create(greedy('llama', 'hi', { max_tokens: 1 }));
    const bad = await postJSON(s.base, '/v1/chat/completions', greedy('broken', 'hi'));
    const llama = await getJSON(s.base, '/v1/models/llama');
    assert.equal(llama.json.resident, true, JSON.stringify(llama.json));
    assert.ok(bad.status >= 400, bad.text);
    assert.match(bad.json.error.message, /model\.safetensors/);
    // the client learns which model and file, never where the server keeps them
    assert.ok(!bad.json.error.message.includes(dir), bad.json.error.message);
    assert.ok(!bad.json.error.message.includes(os.tmpdir()), bad.json.error.message);
    const ok = await s.client().chat.completions.create(greedy('llama', 'hi', { max_tokens: 2 }));
    assert.equal(ok.usage.completion_tokens, 2);
    // and again at once: the failure is remembered (503, no new load), the server serves on
    const t0 = Date.now();
    const bad2 = await postJSON(s.base, '/v1/completions', { model: 'broken', prompt: 'x' });
    assert.equal(bad2.status, 503, bad2.text);
    assert.equal(bad2.json.error.code, 'model_unavailable');
    assert.match(bad2.json.error.message, /model\.safetensors.*tried again in \d+ s, or when its files change/);
    assert.ok(Date.now() - t0 < 1000);
    assert.ok(!bad2.json.error.message.includes(dir), bad2.json.error.message);
    assert.equal((await fetch(`${s.base}/health`)).status, 200);
    // its files are mended: the next request loads it
    copyFileSync(path.join(DATA, 'tiny-llama3', 'model.safetensors'), path.join(dir, 'model.safetensors'));
    const good = await s.client().chat.completions.create(greedy('broken', 'hi', { max_tokens: 2 }));
    assert.equal(good.usage.completion_tokens, 2);
  } finally {
    const r = await s.stop();
    rmSync(dir, { recursive: true, force: true });
    assert.equal(r.code, 0, s.log());
  }
});

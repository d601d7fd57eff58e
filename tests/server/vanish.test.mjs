// A served model's files truncated and then overwritten on disk while its requests run (a
// re-download, a sync): the process lives, the other model answers, the model answers from
// what it loaded; once unloaded it fails with a 503 while its files are broken, and loads
// again once they are whole. A server that read its weights from a shared mapping of the file
// died here with SIGBUS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, copyFileSync, readFileSync, writeFileSync, truncateSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, greedy, postJSON, getJSON, QWEN, DATA } from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'atlas-vanish-'));
const weights = path.join(dir, 'model.safetensors');
let srv, client;
before(async () => {
  for (const f of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'model.safetensors'])
    copyFileSync(path.join(DATA, 'tiny-llama3', f), path.join(dir, f));
  srv = await startServer(['--model', `vanish=${dir}`, '--model', QWEN, '--max-resident', '2', '--parallel', '8']);
  client = srv.client();
});
after(async () => {
  const r = await srv.stop();
  rmSync(dir, { recursive: true, force: true });
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const ask = async (model, text, max = 16) =>
  (await client.chat.completions.create(greedy(model, text, { max_tokens: max }))).choices[0].message.content;

// Streams a reply, reading slowly so that it is still running when the files change.
async function slowStream(model, text, max) {
  const s = await client.chat.completions.create({ ...greedy(model, text, { max_tokens: max }), stream: true });
  let out = '';
  for await (const ch of s) {
    out += ch.choices[0]?.delta?.content ?? '';
    await new Promise((r) => setTimeout(r, 2));
  }
  return out;
}

test('files cut short and rewritten under a served model: it answers from memory', async () => {
  const good = readFileSync(weights);
  const want = await ask('vanish', 'what is left', 24);
  const wantQwen = await ask('qwen', 'still here', 8);
  const running = [];
  for (let i = 0; i < 8; i++) running.push(slowStream('vanish', 'what is left', 24));
  // while they run: cut to a tenth, then write garbage of the old length over it
  await new Promise((r) => setTimeout(r, 20));
  truncateSync(weights, Math.floor(good.length / 10));
  const during = await ask('vanish', 'what is left', 24);
  writeFileSync(weights, Buffer.alloc(good.length, 0x5a));
  const answers = await Promise.all(running);
  for (const a of answers) assert.equal(a, want);
  assert.equal(during, want);
  assert.equal(await ask('vanish', 'what is left', 24), want);
  assert.equal(await ask('qwen', 'still here', 8), wantQwen);
  assert.equal(srv.child.exitCode, null, srv.log());

  // unloaded, it cannot come back from broken files: 503 with the reason, the server serves on
  const un = await postJSON(srv.base, '/v1/models/vanish/unload', {});
  assert.equal(un.status, 200, un.text);
  const bad = await postJSON(srv.base, '/v1/chat/completions', greedy('vanish', 'what is left'));
  assert.equal(bad.status, 503, bad.text);
  assert.equal(bad.json.error.code, 'model_unavailable', bad.text);
  assert.match(bad.json.error.message, /vanish/);
  assert.ok(!bad.json.error.message.includes(dir), bad.json.error.message);
  truncateSync(weights, 100); // cut short too: header checks catch it
  const bad2 = await postJSON(srv.base, '/v1/chat/completions', greedy('vanish', 'what is left'));
  assert.equal(bad2.status, 503, bad2.text);
  assert.equal(await ask('qwen', 'still here', 8), wantQwen);
  // /health and /v1/models say which model failed, why and when it is tried again
  const h = await getJSON(srv.base, '/health');
  assert.equal(h.status, 200);
  assert.equal(h.json.status, 'degraded', h.text);
  const st = Object.fromEntries(h.json.model_states.map((m) => [m.id, m]));
  assert.equal(st.vanish.state, 'failed', h.text);
  assert.ok(st.vanish.failed_loads >= 2 && st.vanish.retry_in_s > 0, h.text);
  assert.match(st.vanish.last_error, /model\.safetensors/, h.text);
  assert.ok(!h.text.includes(dir), h.text);
  assert.equal(st.qwen.state, 'resident', h.text);
  assert.equal(st.qwen.failed_loads, undefined, h.text);
  const one = await getJSON(srv.base, '/v1/models/vanish');
  assert.equal(one.json.state, 'failed', one.text);

  // whole again (new size and time): the next request loads it and answers as before
  writeFileSync(weights, good);
  assert.equal(statSync(weights).size, good.length);
  assert.equal(await ask('vanish', 'what is left', 24), want);
  assert.equal(srv.child.exitCode, null, srv.log());
  const h2 = await getJSON(srv.base, '/health');
  assert.equal(h2.json.status, 'ok', h2.text);
  assert.deepEqual(h2.json.model_states.map((m) => m.state), ['resident', 'resident'], h2.text);
  assert.equal((await getJSON(srv.base, '/v1/models/vanish')).json.state, 'resident');
});

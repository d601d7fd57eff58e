// The server's edges in time: a full queue answers 429 with Retry-After, SIGTERM in the
// middle of requests ends each of them properly (a stream gets an error event and
// [DONE], a waiting request a 503) and the process exits 0; --models-dir finds models.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, symlinkSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, getJSON, greedy, LLAMA, DATA } from './lib.mjs';

const long = (stream) => ({ model: 'llama', prompt: 'go', max_tokens: 100000, ignore_eos: true, stream });

test('queue full: 429 with Retry-After, the others served', async () => {
  const srv = await startServer(['--model', LLAMA, '--parallel', '1', '--queue-limit', '1']);
  try {
    const ac = new AbortController();
    // one running forever, then one waiting: the queue is full
    const running = fetch(`${srv.base}/v1/completions`, { method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' }, body: JSON.stringify(long(true)) });
    await (await running).body.getReader().read();
    const waiting = postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: 'x', max_tokens: 2 });
    // under load the probes below could overtake it and take its queue place themselves:
    // wait until the engine reports it queued
    for (let i = 0; i < 100; i++) {
      const h = await getJSON(srv.base, '/health');
      if (h.json && h.json.queued >= 1) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    let full;
    for (let i = 0; i < 50; i++) {
      full = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: 'y', max_tokens: 2 });
      if (full.status === 429) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(full.status, 429, full.text);
    assert.equal(full.json.error.type, 'rate_limit_error');
    assert.ok(Number(full.headers.get('retry-after')) >= 1);
    ac.abort(); // the running one leaves: the waiting one gets its turn
    const w = await waiting;
    assert.equal(w.status, 200, w.text);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
  }
});

test('SIGTERM mid-request: streams end with an error event and [DONE], waiters get 503, exit 0', async () => {
  const srv = await startServer(['--model', LLAMA]);
  const res = await fetch(`${srv.base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(long(true)) });
  const reader = res.body.getReader();
  await reader.read();
  const whole = postJSON(srv.base, '/v1/completions', long(false));
  await new Promise((r) => setTimeout(r, 300));
  const exit = srv.stop();
  let text = '';
  for (;;) { const { value, done } = await reader.read(); if (done) break; text += new TextDecoder().decode(value); }
  assert.match(text, /data: \{"error":\{"message":"[^"]*shutting down/);
  assert.ok(text.endsWith('data: [DONE]\n\n'), text.slice(-100));
  const w = await whole;
  assert.equal(w.status, 503, w.text);
  assert.equal(w.json.error.code, 'shutting_down');
  assert.equal((await exit).code, 0, srv.log());
});

test('--models-dir serves every model directory under it', async () => {
  const root = mkdtempSync(path.join(os.tmpdir(), 'atlas-models-'));
  symlinkSync(path.join(DATA, 'tiny-llama3'), path.join(root, 'alpha'));
  symlinkSync(path.join(DATA, 'tiny-qwen3'), path.join(root, 'beta'));
  const srv = await startServer(['--models-dir', root]);
  try {
    const ids = (await srv.client().models.list()).data.map((m) => m.id).sort();
    assert.deepEqual(ids, ['alpha', 'beta']);
    const r = await srv.client().chat.completions.create(greedy('beta', 'hi', { max_tokens: 2 }));
    assert.equal(r.model, 'beta');
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
    rmSync(root, { recursive: true, force: true });
  }
});

// A model is not released while a request runs on it (include/atlas/engine.h, "Releasing a
// model"): every running request holds a handle on its model, so an unload while a stream
// runs is refused with the count of requests in flight, the stream goes on, and the model
// is released once the stream has ended (here its client goes away); an unload then is
// granted.  With --max-resident 1 and --drain-timeout 0 a request for another model waits,
// in the queue, until the stream on the resident one has ended, and only then is the other
// model swapped in (drain.test.mjs has the timeout).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, getJSON, greedy, LLAMA, QWEN } from './lib.mjs';

const endless = { model: 'llama', prompt: 'go', max_tokens: 100000, ignore_eos: true, stream: true };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts a stream and returns once its first chunk came: the request is running.
async function openStream(srv, body) {
  const ac = new AbortController();
  const res = await fetch(`${srv.base}/v1/completions`, {
    method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  const first = await reader.read();
  assert.ok(!first.done);
  return { ac, reader };
}

const model = async (srv, name) => (await getJSON(srv.base, `/v1/models/${name}`)).json;

// Polls model name until pred holds (10 s at most); returns its last state.
async function waitModel(srv, name, pred) {
  let m;
  for (let i = 0; i < 500; i++) {
    m = await model(srv, name);
    if (pred(m)) return m;
    await sleep(20);
  }
  return m;
}

test('unload while a stream runs: refused with the count, granted after the stream ended', async () => {
  const srv = await startServer(['--model', LLAMA]);
  try {
    const s = await openStream(srv, endless);
    const un = await postJSON(srv.base, '/v1/models/llama/unload', {});
    assert.equal(un.status, 409, un.text); // refused, not failed
    assert.equal(un.json.error.code, 'model_busy');
    assert.match(un.json.error.message, /'llama' has 1 request\(s\) in flight/);
    let m = await model(srv, 'llama');
    assert.equal(m.resident, true);
    assert.equal(m.running, 1);
    // the stream goes on
    const more = await s.reader.read();
    assert.ok(!more.done);
    // its client goes away: the request ends, and the refused unload is carried out
    s.ac.abort();
    m = await waitModel(srv, 'llama', (x) => !x.resident);
    assert.equal(m.resident, false, JSON.stringify(m));
    assert.equal(m.running, 0);
    const granted = await postJSON(srv.base, '/v1/models/llama/unload', {});
    assert.equal(granted.status, 200, granted.text);
    assert.equal(granted.json.resident, false);
    // and the model comes back for the next request
    const ok = await srv.client().chat.completions.create(greedy('llama', 'hi', { max_tokens: 3 }));
    assert.equal(ok.usage.completion_tokens, 3);
    // nothing runs now: an unload is granted at once
    const now = await postJSON(srv.base, '/v1/models/llama/unload', {});
    assert.equal(now.status, 200, now.text);
    assert.equal(now.json.resident, false);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
  }
});

test('swap with --max-resident 1, no drain timeout: the other model waits until the running stream ended', async () => {
  const srv = await startServer(['--model', LLAMA, '--model', QWEN, '--max-resident', '1', '--drain-timeout', '0']);
  try {
    const s = await openStream(srv, endless);
    let answered = false;
    const other = srv.client().chat.completions.create(greedy('qwen', 'hi', { max_tokens: 3 }))
      .then((r) => { answered = true; return r; });
    const q = await waitModel(srv, 'qwen', (x) => x.waiting >= 1);
    assert.equal(q.waiting, 1, JSON.stringify(q));
    // the release of llama is refused while its stream runs: it stays, qwen waits
    await sleep(300);
    assert.equal(answered, false);
    const l = await model(srv, 'llama');
    assert.equal(l.resident, true);
    assert.equal(l.running, 1);
    assert.equal((await model(srv, 'qwen')).resident, false);
    // the stream's client goes away: llama is released, qwen loaded and served
    s.ac.abort();
    const r = await other;
    assert.equal(r.usage.completion_tokens, 3);
    assert.equal((await model(srv, 'llama')).resident, false);
    assert.equal((await model(srv, 'qwen')).resident, true);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
  }
});

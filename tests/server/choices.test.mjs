// Several choices in one request (OpenAI's "n", and prompt arrays of /v1/completions),
// through the official Node SDK: choice j of a prompt is what a single request with seed
// seed + j gives, choices are numbered prompt-major, a prompt's tokens count once.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, postJSON, LLAMA } from './lib.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--model', LLAMA, '--parallel', '8']);
  client = srv.client();
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const MESSAGES = [{ role: 'user', content: 'Tell me a story.' }];

test('chat: n choices, each equal to the single request with seed + j', async () => {
  const r = await client.chat.completions.create({
    model: 'llama', messages: MESSAGES, n: 3, temperature: 1, seed: 40, max_tokens: 12,
  });
  assert.equal(r.choices.length, 3);
  let completion = 0;
  for (let j = 0; j < 3; j++) {
    const c = r.choices[j];
    assert.equal(c.index, j);
    assert.ok(['stop', 'length'].includes(c.finish_reason));
    const one = await client.chat.completions.create({
      model: 'llama', messages: MESSAGES, temperature: 1, seed: 40 + j, max_tokens: 12,
    });
    assert.equal(c.message.content, one.choices[0].message.content, `choice ${j}`);
    assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens, 'the prompt counts once');
    completion += one.usage.completion_tokens;
  }
  assert.equal(r.usage.completion_tokens, completion);
  // seeded sampling at temperature 1 over a random model: the three differ
  assert.equal(new Set(r.choices.map((c) => c.message.content)).size, 3);
});

test('completions: prompts x n, prompt-major', async () => {
  const prompts = ['Once upon a time', 'The weather today'];
  const r = await client.completions.create({
    model: 'llama', prompt: prompts, n: 2, temperature: 1, seed: 9, max_tokens: 8,
  });
  assert.equal(r.choices.length, 4);
  let promptTokens = 0;
  for (let i = 0; i < 2; i++) {
    for (let j = 0; j < 2; j++) {
      const c = r.choices[i * 2 + j];
      assert.equal(c.index, i * 2 + j);
      const one = await client.completions.create({
        model: 'llama', prompt: prompts[i], temperature: 1, seed: 9 + j, max_tokens: 8,
      });
      assert.equal(c.text, one.choices[0].text, `prompt ${i} choice ${j}`);
      if (j === 0) promptTokens += one.usage.prompt_tokens;
    }
  }
  assert.equal(r.usage.prompt_tokens, promptTokens);
});

test('limits: n x prompts at most 16', async () => {
  let r = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: Array(9).fill('a'), n: 2 });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'n');
  assert.match(r.json.error.message, /18 choices/);
  r = await postJSON(srv.base, '/v1/chat/completions', { model: 'llama', messages: MESSAGES, n: 0 });
  assert.equal(r.status, 400);
});

// Joins a stream's chunks by choice index; checks one id, one usage chunk, one finish each.
async function collect(stream) {
  const out = {}, ids = new Set();
  let usage = null, finishes = 0;
  for await (const c of stream) {
    ids.add(c.id);
    if (c.usage) {
      assert.equal(usage, null, 'one usage chunk');
      assert.equal(c.choices.length, 0);
      usage = c.usage;
    }
    for (const ch of c.choices) {
      const o = (out[ch.index] ??= { text: '', finish: null });
      o.text += ch.delta?.content ?? ch.text ?? '';
      if (ch.finish_reason) {
        assert.equal(o.finish, null, `choice ${ch.index} finishes once`);
        o.finish = ch.finish_reason;
        finishes++;
      }
    }
  }
  assert.equal(ids.size, 1, 'every chunk carries the same id');
  return { out, usage, finishes };
}

test('streamed: n choices interleaved by index, each as the non-streamed one', async () => {
  const req = { model: 'llama', messages: MESSAGES, n: 4, temperature: 1, seed: 3, max_tokens: 10 };
  const whole = await client.chat.completions.create(req);
  const { out, usage, finishes } = await collect(await client.chat.completions.create({
    ...req, stream: true, stream_options: { include_usage: true },
  }));
  assert.equal(finishes, 4);
  for (let j = 0; j < 4; j++) {
    assert.equal(out[j].text, whole.choices[j].message.content, `choice ${j}`);
    assert.equal(out[j].finish, whole.choices[j].finish_reason);
  }
  assert.deepEqual([usage.prompt_tokens, usage.completion_tokens],
    [whole.usage.prompt_tokens, whole.usage.completion_tokens]);
});

test('streamed: several prompts of /v1/completions x n', async () => {
  const req = { model: 'llama', prompt: ['In the beginning', 'Far away'], n: 2, temperature: 1, seed: 11, max_tokens: 6 };
  const whole = await client.completions.create(req);
  const { out, usage } = await collect(await client.completions.create({
    ...req, stream: true, stream_options: { include_usage: true },
  }));
  for (let k = 0; k < 4; k++) assert.equal(out[k].text, whole.choices[k].text, `choice ${k}`);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('streamed choices: a client that leaves mid-stream frees them all', async () => {
  // a raw socket, closed after the first chunks: the three sequences must go at once
  const body = JSON.stringify({ model: 'llama', messages: MESSAGES, n: 3, max_tokens: 4000,
    ignore_eos: true, stream: true });
  await new Promise((resolve, reject) => {
    const req = http.request(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => {
      let seen = 0;
      res.on('data', (d) => { seen += d.length; if (seen > 2000) { req.destroy(); resolve(); } });
      res.on('end', () => reject(new Error('the stream ended before the client left')));
    });
    req.on('error', () => {});
    req.end(body);
  });
  let running = -1, active = -1;
  for (let i = 0; i < 50 && (running !== 0 || active !== 0); i++) {
    await new Promise((r) => setTimeout(r, 100));
    const m = await (await fetch(`${srv.base}/metrics`)).text();
    running = Number(m.match(/^atlas_running_sequences (\d+)/m)?.[1] ?? -1);
    active = Number(m.match(/^atlas_requests_active (\d+)/m)?.[1] ?? -1);
  }
  assert.equal(running, 0, 'no sequence left in the engine');
  assert.equal(active, 0, 'no generation left in the server');
});

// Several choices in one request (OpenAI's "n", and prompt arrays of /v1/completions),
// through the official Node SDK: choice j of a prompt is what a single request with seed
// seed + j gives, choices are numbered prompt-major, a prompt's tokens count once.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
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

test('limits: n x prompts at most 16, no streaming of several choices', async () => {
  let r = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: Array(9).fill('a'), n: 2 });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'n');
  assert.match(r.json.error.message, /18 choices/);
  r = await postJSON(srv.base, '/v1/chat/completions', { model: 'llama', messages: MESSAGES, n: 2, stream: true });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'n');
  r = await postJSON(srv.base, '/v1/chat/completions', { model: 'llama', messages: MESSAGES, n: 0 });
  assert.equal(r.status, 400);
});

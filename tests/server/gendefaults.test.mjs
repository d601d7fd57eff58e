// A model directory's generation_config.json gives the sampling defaults of the requests to
// it that leave those fields out, as vLLM applies them; a request's own field overrides them.
// Its max_new_tokens is the max_tokens of a request that sets none, cut to the context.
// Three copies of one model differ only in that file, so equal draws mean equal settings.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, DATA } from './lib.mjs';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'atlas-gendefaults-'));
const src = path.join(DATA, 'tiny-llama3');
function copy(name, sampling) {
  const dir = path.join(tmp, name);
  mkdirSync(dir);
  for (const f of ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json'])
    symlinkSync(path.join(src, f), path.join(dir, f));
  const gen = JSON.parse(readFileSync(path.join(src, 'generation_config.json'), 'utf8'));
  writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ ...gen, ...sampling }));
  return `${name}=${dir}`;
}

let srv;
before(async () => {
  srv = await startServer(['--device', 'cpu', '--max-resident', '5',
    '--model', copy('cold', { temperature: 0 }),
    '--model', copy('hot', { temperature: 2.0 }),
    '--model', copy('k1', { temperature: 2.0, top_k: 1 }),
    '--model', copy('rep', { temperature: 0, repetition_penalty: 1.5 }),
    '--model', copy('short', { temperature: 0, max_new_tokens: 5 })]);
});
after(async () => {
  const r = await srv.stop();
  rmSync(tmp, { recursive: true, force: true });
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const complete = async (body) => {
  const r = await postJSON(srv.base, '/v1/completions',
    { prompt: 'Once upon a time', max_tokens: 12, ignore_eos: true, ...body });
  assert.equal(r.status, 200, r.text);
  return r.json.choices[0].text;
};

test('a temperature of 0 in generation_config.json makes requests without one greedy', async () => {
  const greedy = await complete({ model: 'hot', temperature: 0 });
  assert.equal(await complete({ model: 'cold', seed: 1 }), greedy);
  assert.equal(await complete({ model: 'cold', seed: 2 }), greedy);
  // chat reads the same defaults
  const chat = (model, extra) => postJSON(srv.base, '/v1/chat/completions', { model, max_tokens: 12,
    ignore_eos: true, messages: [{ role: 'user', content: 'Hi' }], ...extra });
  const a = await chat('cold', { seed: 3 }), b = await chat('hot', { seed: 3, temperature: 0 });
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.choices[0].message.content, b.json.choices[0].message.content);
});

test('a high default temperature samples, and the request\'s field overrides it', async () => {
  const greedy = await complete({ model: 'cold' });
  const draws = new Set();
  for (const seed of [1, 2, 3, 4]) draws.add(await complete({ model: 'hot', seed }));
  assert.ok(draws.size > 1, `temperature 2 from the file drew ${[...draws]}`);
  assert.ok([...draws].some((t) => t !== greedy));
  // the file's temperature 2 draws exactly what the field temperature 2 draws
  assert.equal(await complete({ model: 'hot', seed: 7 }), await complete({ model: 'cold', seed: 7, temperature: 2 }));
  // and the request's temperature 0 wins over the file's 2
  assert.equal(await complete({ model: 'hot', seed: 7, temperature: 0 }), greedy);
});

test('top_k from the file applies, and top_k -1 in the request turns it off', async () => {
  const greedy = await complete({ model: 'cold' });
  assert.equal(await complete({ model: 'k1', seed: 5 }), greedy);
  assert.equal(await complete({ model: 'k1', seed: 5, top_k: -1 }), await complete({ model: 'hot', seed: 5 }));
});

test('repetition_penalty from the file applies as the request\'s field does', async () => {
  const plain = await complete({ model: 'cold', max_tokens: 24 });
  const penalised = await complete({ model: 'cold', max_tokens: 24, repetition_penalty: 1.5 });
  assert.notEqual(penalised, plain, 'the penalty changes this prompt\'s greedy text');
  assert.equal(await complete({ model: 'rep', max_tokens: 24 }), penalised);
  assert.equal(await complete({ model: 'rep', max_tokens: 24, repetition_penalty: 1 }), plain);
});

test('max_new_tokens from the file is the max_tokens of requests without one', async () => {
  const usage = async (route, body) => {
    const r = await postJSON(srv.base, route, { model: 'short', ignore_eos: true, ...body });
    assert.equal(r.status, 200, r.text);
    return r.json.usage.completion_tokens;
  };
  assert.equal(await usage('/v1/completions', { prompt: 'Once upon a time' }), 5);
  assert.equal(await usage('/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }] }), 5);
  assert.equal(await usage('/v1/completions', { prompt: 'Once upon a time', max_tokens: 7 }), 7);
  assert.equal(await usage('/v1/chat/completions',
    { messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 3 }), 3);
});

test('a max_new_tokens beyond the context is cut to it, not refused', async () => {
  const small = await startServer(['--device', 'cpu', '--ctx-size', '32',
    '--model', copy('huge', { temperature: 0, max_new_tokens: 100000 })]);
  try {
    const r = await postJSON(small.base, '/v1/completions',
      { model: 'huge', prompt: 'Once upon a time', ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.prompt_tokens + r.json.usage.completion_tokens, 32, r.text);
    assert.equal(r.json.choices[0].finish_reason, 'length');
    // a request's own max_tokens past the context is still refused
    const over = await postJSON(small.base, '/v1/completions',
      { model: 'huge', prompt: 'Once upon a time', max_tokens: 100 });
    assert.equal(over.status, 400, over.text);
  } finally {
    const r = await small.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${small.log()}`);
  }
});

// A model directory's generation_config.json gives the sampling defaults of the requests to
// it that leave those fields out, as vLLM applies them; a request's own field overrides them.
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
  srv = await startServer(['--device', 'cpu', '--max-resident', '3',
    '--model', copy('cold', { temperature: 0 }),
    '--model', copy('hot', { temperature: 2.0 }),
    '--model', copy('k1', { temperature: 2.0, top_k: 1 })]);
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

// tests/server/embeddings.test.mjs — embeddings through the official clients: OpenAI's
// /v1/embeddings (client.embeddings.create, float and base64) and Ollama's /api/embed (the
// ollama client), on tiny Qwen3-Embedding-shaped checkpoints made at test time
// (embedmodel.mjs). The vectors are checked against what a causal decoder's pooling must give,
// computed in the test from the engine's own last-token vectors of each prefix: a mean over a
// sequence is the mean of its prefixes' last hidden states, cls is the first token's, and the
// Normalize module divides by the norm. (The comparison with transformers' forward waits for a
// GPU machine: tools/embed/reference.py.)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Ollama } from 'ollama';
import { BIN, startServer, postJSON, DEFAULT } from './lib.mjs';
import { writeEmbedModel, EOS } from './embedmodel.mjs';

let srv, openai, ollama, root;
const CTX = 64;

before(async () => {
  root = mkdtempSync(path.join(tmpdir(), 'atlas-embed-'));
  const m = (name, opts) => writeEmbedModel(path.join(root, name), opts);
  m('emb');                                            // Qwen3-Embedding's: last token, normalised
  m('raw', { normalize: false });                      // last token, as computed
  m('mean', { pooling: 'mean', normalize: false });
  m('cls', { pooling: 'cls', normalize: false });
  m('mat', { config: { is_matryoshka: true, matryoshka_dimensions: [8, 16] } });
  const models = ['emb', 'raw', 'mean', 'cls', 'mat'].map((name) => ({ name, dir: name }));
  models.push({ name: 'preset-mat', dir: 'emb', matryoshka_dimensions: [16] });
  writeFileSync(path.join(root, 'models.json'), JSON.stringify({ models }));
  // a step of 24 tokens: an input of 64 is computed (and pooled) over three steps
  srv = await startServer(['--models-preset', path.join(root, 'models.json'), '--model', DEFAULT,
    '--max-resident', '7', '--ctx-size', String(CTX), '--batch-tokens', '24', '--parallel', '8']);
  openai = srv.client();
  ollama = new Ollama({ host: srv.base });
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  rmSync(root, { recursive: true, force: true });
});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const maxDiff = (a, b) => { assert.equal(a.length, b.length); return Math.max(...a.map((x, i) => Math.abs(x - b[i]))); };
const close = (a, b, tol, what) => assert.ok(maxDiff(a, b) <= tol, `${what}: max |diff| ${maxDiff(a, b)} > ${tol}`);

async function embed(model, input, extra = {}) {
  const r = await postJSON(srv.base, '/v1/embeddings', { model, input, encoding_format: 'float', ...extra });
  assert.equal(r.status, 200, r.text);
  return r.json;
}
const vectors = async (model, input) => (await embed(model, input)).data.map((d) => d.embedding);

test('the OpenAI client: one string, eos appended, unit norm, usage', async () => {
  const r = await openai.embeddings.create({ model: 'emb', input: 'hello world' }); // base64 on the wire
  assert.equal(r.object, 'list');
  assert.equal(r.model, 'emb');
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].index, 0);
  assert.equal(r.data[0].embedding.length, 32);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
  // 11 bytes of a byte-level vocabulary and the <|endoftext|> its post-processor appends
  assert.deepEqual(r.usage, { prompt_tokens: 12, total_tokens: 12 });
  const ids = await tokenize('hello world');
  assert.equal(ids.length, 11);
  const [viaIds] = await vectors('emb', [[...ids, EOS]]);
  close(viaIds.map(Math.fround), r.data[0].embedding, 0, 'token ids and the text they spell');
});

async function tokenize(text) {
  const r = await postJSON(srv.base, '/tokenize', { model: 'emb', prompt: text });
  assert.equal(r.status, 200, r.text);
  return r.json.tokens.filter((t) => t !== EOS);
}

test('base64 is the float32 vector, little-endian', async () => {
  const f = await embed('emb', ['abc', 'de']);
  const b = await embed('emb', ['abc', 'de'], { encoding_format: 'base64' });
  for (let i = 0; i < 2; i++) {
    const raw = Buffer.from(b.data[i].embedding, 'base64');
    assert.equal(raw.length, 32 * 4);
    const back = Array.from({ length: 32 }, (_, k) => raw.readFloatLE(4 * k));
    assert.deepEqual(back, f.data[i].embedding.map(Math.fround));
  }
  const sdk = await openai.embeddings.create({ model: 'emb', input: ['abc', 'de'] });
  assert.deepEqual(sdk.data.map((d) => d.embedding), f.data.map((d) => d.embedding.map(Math.fround)));
});

test('a batch gives each input the vector it gets alone', async () => {
  const inputs = ['the first input', 'b', 'a somewhat longer third input, to be prefilled', [65, 66, 67]];
  const together = await vectors('emb', inputs);
  for (let i = 0; i < inputs.length; i++) {
    const [alone] = await vectors('emb', [inputs[i]]);
    close(together[i], alone, 1e-6, `input ${i}`);
  }
  const many = await embed('emb', Array.from({ length: 100 }, (_, i) => `input ${i}`));
  assert.equal(many.data.length, 100);
  assert.deepEqual(many.data.map((d) => d.index), [...Array(100).keys()]);
  close(many.data[7].embedding, (await vectors('emb', 'input 7'))[0], 1e-6, 'input 7 of 100');
});

test('pooling: mean, last and cls against the prefixes\' last hidden states', async () => {
  const S = [10, 20, 30, 40, 50, 60, 70];
  const prefixes = S.map((_, k) => S.slice(0, k + 1));
  const lasts = await vectors('raw', prefixes); // the final-norm hidden state at each position
  const mean = lasts[0].map((_, j) => lasts.reduce((s, v) => s + v[j], 0) / lasts.length);
  const [m] = await vectors('mean', [S]);
  const [c] = await vectors('cls', [S]);
  const [l] = await vectors('raw', [S]);
  const [n] = await vectors('emb', [S]);
  const scale = Math.max(...lasts.flat().map(Math.abs));
  close(m, mean, 1e-5 * scale, 'mean pooling');
  close(c, lasts[0], 1e-5 * scale, 'cls pooling');
  close(l, lasts[S.length - 1], 0, 'last-token pooling');
  close(n, l.map((x) => x / norm(l)), 1e-6, 'normalised');
  assert.ok(maxDiff(m, l) > 1e-3 && maxDiff(c, l) > 1e-3 && maxDiff(m, c) > 1e-3, 'the poolings differ');
  // an input longer than a step's budget is pooled over its chunks, beside other inputs'
  const long = Array.from({ length: CTX }, (_, i) => (i * 37) % 256);
  const [ml, , mlShort] = await vectors('mean', [long, [1, 2, 3], S]);
  const [cl] = await vectors('cls', [long]);
  const [rl] = await vectors('raw', [long]);
  const ll = await vectors('raw', long.map((_, k) => long.slice(0, k + 1)));
  close(ml, ll[0].map((_, j) => ll.reduce((s, v) => s + v[j], 0) / ll.length), 1e-5 * scale, 'mean of 64');
  close(cl, ll[0], 1e-5 * scale, 'cls of 64');
  close(rl, ll[CTX - 1], 1e-5 * scale, 'last of 64');
  close(mlShort, m, 1e-5 * scale, 'mean of 7 beside a long input');
});

test('dimensions: Matryoshka widths from config.json or the models file, else a 400', async () => {
  const [full] = await vectors('mat', 'matryoshka');
  const cut = await embed('mat', 'matryoshka', { dimensions: 16 });
  const v = cut.data[0].embedding;
  assert.equal(v.length, 16);
  close(v, full.slice(0, 16).map((x) => x / norm(full.slice(0, 16))), 1e-6, 'cut, then normalised');
  let r = await postJSON(srv.base, '/v1/embeddings', { model: 'mat', input: 'x', dimensions: 12 });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'dimensions');
  assert.match(r.json.error.message, /not one of .*Matryoshka dimensions \(8, 16\)/);
  assert.equal((await embed('preset-mat', 'x', { dimensions: 16 })).data[0].embedding.length, 16);
  r = await postJSON(srv.base, '/v1/embeddings', { model: 'emb', input: 'x', dimensions: 16 });
  assert.equal(r.status, 400);
  assert.match(r.json.error.message, /declares no Matryoshka dimensions/);
  const o = await ollama.embed({ model: 'mat', input: 'matryoshka', dimensions: 8 });
  assert.equal(o.embeddings[0].length, 8);
});

test('errors in each dialect', async () => {
  const cases = [
    [{ model: 'emb', input: '' }, 400, /empty string/],
    [{ model: 'emb', input: [] }, 400, /empty list/],
    [{ model: 'emb' }, 400, /'input' is required/],
    [{ model: 'emb', input: [[1, 999999]] }, 400, /token id/],
    [{ model: 'emb', input: 'x'.repeat(CTX + 5) }, 400, /has 70 tokens, the context .* holds 64/],
    [{ model: 'emb', input: 'x', encoding_format: 'int8' }, 400, /encoding_format/],
    [{ model: 'default', input: 'x' }, 400, /'default' is not an embedding model/],
    [{ model: 'nope', input: 'x' }, 404, /does not exist/],
  ];
  for (const [body, status, re] of cases) {
    const r = await postJSON(srv.base, '/v1/embeddings', body);
    assert.equal(r.status, status, `${JSON.stringify(body)}: ${r.text}`);
    assert.match(r.json.error.message, re);
  }
  for (const route of ['/v1/chat/completions', '/v1/completions', '/api/chat']) {
    const r = await postJSON(srv.base, route, { model: 'emb', prompt: 'hi', stream: false,
      messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(r.status, 400, `${route}: ${r.text}`);
    const msg = route.startsWith('/api') ? r.json.error : r.json.error.message;
    assert.match(msg, /'emb' is an embedding model/);
  }
  await assert.rejects(openai.chat.completions.create({ model: 'emb', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && /embedding model/.test(e.message));
  // Ollama: cut to the context unless truncate is false, errors as {"error": "..."}
  const long = 'y'.repeat(CTX + 10);
  let r = await postJSON(srv.base, '/api/embed', { model: 'emb', input: long, truncate: false });
  assert.equal(r.status, 400);
  assert.match(r.json.error, /the context of model 'emb' holds 64/);
  r = await postJSON(srv.base, '/api/embed', { model: 'emb', input: [long, 'short'] });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.prompt_eval_count, CTX + 6);
  close(r.json.embeddings[0], (await vectors('emb', [long.slice(0, CTX)].map((t) => [...Buffer.from(t)].map((b) => b))))[0], 0, 'the head kept');
  r = await postJSON(srv.base, '/api/embed', { model: 'emb', input: '' });
  assert.equal(r.status, 400);
  assert.equal(typeof r.json.error, 'string');
  r = await postJSON(srv.base, '/api/embed', { model: 'emb:latest', input: 'x', dimensions: 4 });
  assert.equal(r.status, 400);
  assert.match(r.json.error, /Matryoshka/);
});

test('Ollama\'s client: embed, the older embeddings, show', async () => {
  const r = await ollama.embed({ model: 'emb:latest', input: ['alpha', 'beta'] });
  assert.equal(r.model, 'emb');
  assert.equal(r.embeddings.length, 2);
  assert.ok(Number.isInteger(r.total_duration) && r.total_duration > 0);
  assert.equal(r.load_duration, 0);
  assert.equal(r.prompt_eval_count, 6 + 5);
  const viaOpenAI = await vectors('emb', ['alpha', 'beta']);
  for (let i = 0; i < 2; i++) close(r.embeddings[i], viaOpenAI[i], 0, `input ${i}`);
  const old = await ollama.embeddings({ model: 'emb', prompt: 'alpha' });
  close(old.embedding, viaOpenAI[0], 0, '/api/embeddings');
  const show = await ollama.show({ model: 'emb' });
  assert.deepEqual(show.capabilities, ['embedding']);
});

test('a bidirectional checkpoint is refused by name at start', () => {
  const dir = writeEmbedModel(path.join(root, 'gte'), { config: { is_causal: false } });
  const r = spawnSync(BIN, ['serve', '--port', '0', '--model', `gte=${dir}`], { encoding: 'utf8', timeout: 20000 });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /"is_causal": false: a model with bidirectional attention/);
});

// The prefix cache through the server: a prompt sent again reuses its full KV blocks
// (usage.prompt_tokens_details.cached_tokens, and /metrics counts only the rest as
// prefilled), and vLLM's `cache_salt` keeps requests of different salts apart: the same
// prompt under another salt, or none, reuses nothing.  Bad salts are a 400 naming the field.
// Requests that arrive together with one long prefix share it while it is computed: the
// prefix is prefilled once, and the gateway's hit-rate counters on /metrics say so.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, LLAMA } from './lib.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--model', LLAMA, '--parallel', '2']);
  client = srv.client();
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

async function prefilled() {
  const m = await (await fetch(`${srv.base}/metrics`)).text();
  return Number(m.match(/^atlas_prompt_tokens_total (\d+)$/m)[1]);
}

// One greedy completion, alone on the server: its text, usage, and the prompt tokens the
// engine computed for it.
async function complete(prompt, salt, extra = {}) {
  const before = await prefilled();
  const body = { model: 'llama', prompt, max_tokens: 4, temperature: 0, ...extra };
  if (salt !== undefined) body.cache_salt = salt;
  const r = await client.completions.create(body);
  return { text: r.choices[0].text, usage: r.usage, computed: (await prefilled()) - before };
}

const PROMPT = 'The prefix cache keeps the blocks of a prompt that it has seen before, so that ' +
  'a later prompt that starts with the same tokens takes them instead of computing them again. ' +
  'Salts keep the blocks of one tenant away from those of another.';

test('a prompt sent again hits the cache only under its own salt', async () => {
  const first = await complete(PROMPT);
  const n = first.usage.prompt_tokens;
  assert.ok(n > 40, `prompt of ${n} tokens`);
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(first.computed, n);
  const hit = Math.floor((n - 1) / 16) * 16; // full blocks of 16, one token left to compute
  // [salt, cached tokens expected]: a new salt shares nothing, then its own blocks
  const runs = [[undefined, hit], ['tenant-a', 0], ['tenant-b', 0], ['tenant-a', hit],
    ['tenant-b', hit], [undefined, hit], ['tenant-a\u00e9', 0], [null, hit]];
  for (const [salt, cached] of runs) {
    const r = await complete(PROMPT, salt);
    const what = `salt ${JSON.stringify(salt)}`;
    assert.equal(r.usage.prompt_tokens, n, what);
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, cached, what);
    assert.equal(r.computed, n - cached, `${what}: prompt tokens prefilled`);
    assert.equal(r.text, first.text, what);
  }
});

test('chat requests keep their salts apart too', async () => {
  const messages = [{ role: 'system', content: PROMPT }, { role: 'user', content: 'Say hi.' }];
  const chat = async (salt) => {
    const body = { model: 'llama', messages, max_tokens: 2, temperature: 0 };
    if (salt) body.cache_salt = salt;
    return (await client.chat.completions.create(body)).usage;
  };
  const a = await chat('chat-a');
  assert.equal(a.prompt_tokens_details.cached_tokens, 0);
  assert.equal((await chat('chat-b')).prompt_tokens_details.cached_tokens, 0);
  const again = await chat('chat-a');
  assert.ok(again.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(again));
  assert.equal(again.prompt_tokens_details.cached_tokens % 16, 0);
});

test('a cache_salt that is not a sane string is a 400 naming it', async () => {
  // (a NUL in a string is refused with the body, before any field is read)
  const bad = [[5, 'must be a string'], ['', 'must not be empty'], ['s'.repeat(257), 'at most 256'],
    [['a'], 'must be a string'], [{}, 'must be a string']];
  for (const route of ['/v1/completions', '/v1/chat/completions']) {
    const base = route === '/v1/completions' ? { prompt: 'hi' }
      : { messages: [{ role: 'user', content: 'hi' }] };
    for (const [salt, why] of bad) {
      const r = await postJSON(srv.base, route, { model: 'llama', ...base, max_tokens: 1, cache_salt: salt });
      assert.equal(r.status, 400, `${route} ${JSON.stringify(salt).slice(0, 40)}: ${r.text}`);
      assert.equal(r.json.error.param, 'cache_salt', r.text);
      assert.match(r.json.error.message, new RegExp(why), r.text);
    }
    const ok = await postJSON(srv.base, route, { model: 'llama', ...base, max_tokens: 1, cache_salt: 's'.repeat(256) });
    assert.equal(ok.status, 200, ok.text);
  }
});

test('requests arriving together compute their shared prefix once', async () => {
  const wide = await startServer(['--model', LLAMA, '--parallel', '16', '--batch-tokens', '256']);
  try {
    const c = wide.client();
    const metric = async (name) => {
      const m = await (await fetch(`${wide.base}/metrics`)).text();
      return Number(m.match(new RegExp(`^${name} (\\d+)$`, 'm'))[1]);
    };
    const prefix = `${PROMPT} `.repeat(12);
    const ask = (i, salt) => c.completions.create({
      model: 'llama', prompt: `${prefix}Request number ${i} asks:`, max_tokens: 3, temperature: 0,
      ...(salt ? { cache_salt: salt } : {}),
    });
    const [p0, h0] = [await metric('atlas_prompt_tokens_total'), await metric('atlas_prefix_cache_hits_total')];
    const together = await Promise.all(Array.from({ length: 16 }, (_, i) => ask(i)));
    const computed = (await metric('atlas_prompt_tokens_total')) - p0;
    const hits = (await metric('atlas_prefix_cache_hits_total')) - h0;
    const cached = together.map((r) => r.usage.prompt_tokens_details.cached_tokens);
    const shared = Math.min(...together.map((r) => r.usage.prompt_tokens)) - 16;
    assert.ok(shared > 400, `a shared prefix of about ${shared} tokens`);
    const total = together.reduce((n, r) => n + r.usage.prompt_tokens, 0);
    const sum = cached.reduce((a, b) => a + b, 0);
    // computed once, the rest of each prompt on its own, and at most a step's budget more
    assert.ok(computed <= total - 15 * shared + 256, `${computed} prompt tokens computed of ${total}`);
    assert.ok(computed <= total - sum, 'only what was not cached was computed');
    assert.equal(hits, sum, 'atlas_prefix_cache_hits_total counts the cached tokens');
    assert.ok(cached.filter((n) => n >= shared - 16).length >= 15, JSON.stringify(cached));
    // and each answers as it does alone, under a salt of its own
    for (const i of [0, 7, 15]) {
      const alone = await ask(i, `alone-${i}`);
      assert.equal(alone.usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(alone.choices[0].text, together[i].choices[0].text, `request ${i}`);
    }
  } finally {
    const r = await wide.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${wide.log()}`);
  }
});

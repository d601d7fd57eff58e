// 32 concurrent streams against the same requests run one at a time: at temperature 0 on
// the CPU backend every output must be identical (continuous batching must not change
// results), and every stream must be well formed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, greedy, LLAMA, QWEN } from './lib.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--model', LLAMA, '--model', QWEN, '--max-resident', '2', '--parallel', '32']);
  client = srv.client();
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const N = 32;
const bodies = Array.from({ length: N }, (_, i) =>
  greedy(i % 2 ? 'qwen' : 'llama', `Request number ${i}: ${'tell me more '.repeat(i % 5)}about item ${i * 7}`,
    { max_tokens: 4 + (i % 6), ignore_eos: i % 3 === 0 }));

async function streamText(body) {
  const s = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage };
}

test('32 concurrent streams equal the same requests run alone', async () => {
  const alone = [];
  for (const b of bodies) {
    const r = await client.chat.completions.create(b);
    alone.push({ text: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage });
  }
  // sample the engine's running batch while the 32 streams run
  let maxRunning = 0, sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const m = await (await fetch(`${srv.base}/metrics`)).text();
      maxRunning = Math.max(maxRunning, Number(m.match(/atlas_running_sequences (\d+)/)[1]));
      await new Promise((r) => setTimeout(r, 10));
    }
  })();
  const together = await Promise.all(bodies.map(streamText));
  sampling = false;
  await sampler;
  for (let i = 0; i < N; i++) {
    assert.equal(together[i].text, alone[i].text, `request ${i}`);
    assert.equal(together[i].finish, alone[i].finish, `request ${i}`);
    // cached_tokens depends on what the prefix cache holds (the same prompt ran alone
    // first), so it is checked for sense, the counts for equality
    const { prompt_tokens_details: dt, ...ut } = together[i].usage;
    const { prompt_tokens_details: da, ...ua } = alone[i].usage;
    assert.deepEqual(ut, ua, `request ${i}`);
    for (const d of [dt, da]) assert.ok(d.cached_tokens >= 0 && d.cached_tokens < ua.prompt_tokens, `request ${i}`);
    if (bodies[i].ignore_eos) assert.equal(alone[i].usage.completion_tokens, bodies[i].max_tokens);
  }
  // and the batches really were shared: many sequences ran at once
  assert.ok(maxRunning >= 8, `at most ${maxRunning} sequences ran at once`);
});

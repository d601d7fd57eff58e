// --host-cache: a conversation whose model was swapped out and back continues from its
// prefix KV kept in host memory.  Two models, one resident at a time: the second turn of a
// chat on llama after a request for qwen reports its first turn's blocks as cached
// (usage.prompt_tokens_details.cached_tokens), answers as the same turn did on a server
// that kept nothing, and /metrics counts the blocks saved and restored.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, getJSON, LLAMA, QWEN } from './lib.mjs';

const servers = [];
after(async () => {
  for (const srv of servers) {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  }
});

const metric = (text, name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);

const FIRST = 'Tell me how a paged KV cache keeps the blocks of a prompt it has seen, so that a ' +
  'conversation that comes back later takes them instead of computing them again.';

// Two turns of a chat on llama with a request for qwen between them.
async function converse(hostCache) {
  const srv = await startServer(['--model', LLAMA, '--model', QWEN, '--max-resident', '1',
    '--host-cache', hostCache, '--device', 'cpu', '--parallel', '2']);
  servers.push(srv);
  const client = srv.client();
  const ask = (model, messages) => client.chat.completions.create(
    { model, messages, max_tokens: 8, temperature: 0 });
  const turn1 = [{ role: 'user', content: FIRST }];
  const a1 = await ask('llama', turn1);
  await ask('qwen', [{ role: 'user', content: 'Hello' }]);
  const turn2 = [...turn1, { role: 'assistant', content: a1.choices[0].message.content },
    { role: 'user', content: 'And after a swap?' }];
  const a2 = await ask('llama', turn2);
  const m = (await getJSON(srv.base, '/metrics')).text;
  return { a1, a2, m };
}

test('a conversation resumed after a swap takes its prefix from host memory', async () => {
  const kept = await converse('0.0625');
  const none = await converse('0');
  const cached = kept.a2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 16 * Math.floor((kept.a1.usage.prompt_tokens - 1) / 16) && cached > 0,
    `cached ${cached} of ${kept.a2.usage.prompt_tokens}`);
  assert.ok(metric(kept.m, 'atlas_kv_host_restored_blocks_total') * 16 >= cached);
  assert.ok(metric(kept.m, 'atlas_kv_host_saved_blocks_total') > 0);
  assert.ok(metric(kept.m, 'atlas_kv_host_bytes') > 0);
  assert.equal(none.a2.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(metric(none.m, 'atlas_kv_host_saved_blocks_total'), 0);
  assert.equal(kept.a2.choices[0].message.content, none.a2.choices[0].message.content);
});

// Thinking models through the official Node SDK: a reply that opens with "<think>" is
// answered as reasoning_content + content (llama.cpp's --reasoning-format auto), streamed
// and not; --reasoning-format none leaves it in content.
//
// The fixture Qwen3 has random weights and never thinks by itself. With a logit_bias of +10
// on both "<think>" and "</think>" and a seeded temperature-1 sampler it writes a seeded mix
// of the two tags and other tokens. The same request through /v1/completions on the
// rendered prompt gives the raw text (same prompt ids, seed, bias: the same tokens), which a
// reference splitter written here from the rules in include/atlas/reasoning.h cuts up; the
// chat answer must equal that.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, QWEN } from './lib.mjs';

const OPEN = '<think>', CLOSE = '</think>';
const ws = /^[ \n\r\t]*/;

// The rules of reasoning.h, for a reply whose prompt did not open the block.
function split(raw) {
  const lead = raw.match(ws)[0].length;
  if (!raw.startsWith(OPEN, lead)) return { reasoning: '', content: raw };
  const rest = raw.slice(lead + OPEN.length);
  const k = rest.indexOf(CLOSE);
  if (k < 0) return { reasoning: rest.trim(), content: '' };
  return { reasoning: rest.slice(0, k).trim(), content: rest.slice(k + CLOSE.length).replace(ws, '') };
}

let srv, plain;
const MESSAGES = [{ role: 'user', content: 'Why is the sky blue?' }];
const BIAS = { 151667: 10, 151668: 10 }; // <think>, </think> in Qwen3's vocabulary

before(async () => {
  srv = await startServer(['--model', QWEN, '--parallel', '4']);
  plain = await startServer(['--model', QWEN, '--reasoning-format', 'none']);
});
after(async () => {
  for (const s of [srv, plain]) {
    const r = await s.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${s.log()}`);
  }
});

async function raw(base, seed) {
  const prompt = (await postJSON(base, '/apply-template', { model: 'qwen', messages: MESSAGES })).json.prompt;
  assert.ok(!prompt.trimEnd().endsWith(OPEN), 'this template does not open the block itself');
  const r = await postJSON(base, '/v1/completions', {
    model: 'qwen', prompt, max_tokens: 24, temperature: 1, seed, logit_bias: BIAS,
  });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json.choices[0].text;
}

const ask = (client, seed, extra = {}) => client.chat.completions.create({
  model: 'qwen', messages: MESSAGES, max_tokens: 24, temperature: 1, seed, logit_bias: BIAS, ...extra,
});

test('reasoning_content is split out as the rules say, whole and streamed', async () => {
  const client = srv.client();
  let opened = 0, closed = 0;
  // 12 seeds at least, more until the paths below are met (which seeds open the block
  // depends on the sampler's stream)
  for (let seed = 1; seed <= 12 || (seed <= 48 && (opened < 2 || closed < 1)); seed++) {
    const text = await raw(srv.base, seed);
    const want = split(text);
    if (want.reasoning || text.trimStart().startsWith(OPEN)) opened++;
    if (text.trimStart().startsWith(OPEN) && text.includes(CLOSE)) closed++;

    const r = await ask(client, seed);
    const m = r.choices[0].message;
    assert.equal(m.content ?? '', want.content, `seed ${seed}: content of ${JSON.stringify(text)}`);
    assert.equal(m.reasoning_content ?? '', want.reasoning, `seed ${seed}: reasoning of ${JSON.stringify(text)}`);
    if (!want.reasoning) assert.equal(m.reasoning_content, undefined, `seed ${seed}: no empty reasoning_content`);

    const stream = await ask(client, seed, { stream: true });
    let content = '', reasoning = '';
    for await (const c of stream) {
      const d = c.choices[0]?.delta ?? {};
      content += d.content ?? '';
      reasoning += d.reasoning_content ?? '';
    }
    assert.equal(content, want.content, `seed ${seed}: streamed content`);
    assert.equal(reasoning, want.reasoning, `seed ${seed}: streamed reasoning`);
  }
  // the seeds must exercise the interesting paths, or this test would prove little
  assert.ok(opened >= 2, `replies opening with <think>: ${opened}`);
  assert.ok(closed >= 1, `replies closing it: ${closed}`);
});

test('--reasoning-format none leaves the block in content', async () => {
  for (let seed = 1; seed <= 4; seed++) {
    const text = await raw(plain.base, seed);
    const r = await ask(plain.client(), seed);
    assert.equal(r.choices[0].message.content, text);
    assert.equal(r.choices[0].message.reasoning_content, undefined);
  }
});

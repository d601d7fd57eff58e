// gpt-oss's Harmony format through the server, with real clients: the reply's analysis channel
// as reasoning_content, final as content, a call to functions.NAME as tool_calls, whole and
// streamed, and the same through the Anthropic and Ollama dialects; reasoning_effort and an
// earlier turn's reasoning reaching gpt-oss's own template (tests/data/templates/gpt_oss).
//
// The two checkpoints of tests/data/harmony are made by hand so that greedy decoding writes
// one Harmony reply after any prompt that ends with "assistant" (make.py there): `reason`
//   <|channel|>analysis<|message|>Hmm let me think.<|end|><|start|>assistant<|channel|>final
//   <|message|>Hello world<|return|>
// and `tool`
//   <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
//   <|call|>Hello<|return|>
// whose config names only <|return|> as eos: the reply stops at <|call|> only if the server
// makes it a stop id.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { startServer, postJSON, DATA } from './lib.mjs';

const REASON = `reason=${path.join(DATA, 'harmony', 'reason')}`;
const TOOL = `tool=${path.join(DATA, 'harmony', 'tool')}`;
const TEMPLATE = path.join(DATA, 'templates', 'gpt_oss');
const WEATHER = { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };
const HI = [{ role: 'user', content: 'Hi' }];

let srv, openai;
before(async () => {
  srv = await startServer(['--model', REASON, '--model', TOOL, '--max-resident', '2', '--device', 'cpu',
    '--chat-template', TEMPLATE]);
  openai = srv.client();
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

test('analysis is reasoning_content, final is content', async () => {
  const r = await openai.chat.completions.create({ model: 'reason', messages: HI, temperature: 0 });
  const c = r.choices[0];
  assert.equal(c.message.reasoning_content, 'Hmm let me think.', JSON.stringify(r));
  assert.equal(c.message.content, 'Hello world');
  assert.equal(c.finish_reason, 'stop');
  assert.equal(r.usage.completion_tokens, 14); // <|return|> included
});

test('streamed: reasoning deltas first, then content deltas', async () => {
  const stream = await openai.chat.completions.create({ model: 'reason', messages: HI, temperature: 0, stream: true });
  const kinds = [];
  let reasoning = '', content = '', finish = null;
  for await (const ch of stream) {
    const d = ch.choices[0].delta;
    if (d.reasoning_content) { reasoning += d.reasoning_content; kinds.push('r'); }
    if (d.content) { content += d.content; kinds.push('c'); }
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.equal(reasoning, 'Hmm let me think.');
  assert.equal(content, 'Hello world');
  assert.equal(finish, 'stop');
  assert.deepEqual(kinds, ['r', 'r', 'c', 'c'], 'one delta per text token, reasoning before content');
});

test('a call on commentary to=functions.get_weather is a tool call; <|call|> ends the reply', async () => {
  const r = await openai.chat.completions.create({ model: 'tool', messages: HI, temperature: 0, tools: [WEATHER] });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(r));
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  const tc = c.message.tool_calls[0];
  assert.match(tc.id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(tc.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris' });
  assert.equal(r.usage.completion_tokens, 8); // up to <|call|>, not the Hello after it

  const stream = await openai.chat.completions.create({ model: 'tool', messages: HI, temperature: 0,
    tools: [WEATHER], stream: true });
  const deltas = [];
  let finish = null, content = '';
  for await (const ch of stream) {
    const d = ch.choices[0].delta;
    if (d.tool_calls) deltas.push(...d.tool_calls);
    if (d.content) content += d.content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  assert.equal(deltas.length, 1);
  assert.equal(deltas[0].index, 0);
  assert.equal(deltas[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(deltas[0].function.arguments), { city: 'Paris' });
});

test('without tools in the request, a call is content; a forced tool_choice is refused', async () => {
  const r = await openai.chat.completions.create({ model: 'tool', messages: HI, temperature: 0 });
  assert.equal(r.choices[0].message.content, '{"city": "Paris"}');
  assert.equal(r.choices[0].message.tool_calls, undefined);
  const forced = await postJSON(srv.base, '/v1/chat/completions', { model: 'tool', messages: HI, tools: [WEATHER],
    tool_choice: 'required' });
  assert.equal(forced.status, 400, JSON.stringify(forced.json));
  assert.match(forced.json.error.message, /harmony/);
  assert.equal(forced.json.error.param, 'tool_choice');
});

// The rendered prompt as text: /tokenize's token strings joined.
async function rendered(body) {
  const r = await postJSON(srv.base, '/tokenize', { model: 'reason', return_token_strs: true, ...body });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json.token_strs.join('');
}

test('reasoning_effort reaches the template; another value is refused', async () => {
  assert.match(await rendered({ messages: HI }), /\nReasoning: medium\n/);
  assert.match(await rendered({ messages: HI, reasoning_effort: 'high' }), /\nReasoning: high\n/);
  const low = await openai.chat.completions.create({ model: 'reason', messages: HI, temperature: 0,
    reasoning_effort: 'low' });
  const high = await openai.chat.completions.create({ model: 'reason', messages: HI, temperature: 0,
    reasoning_effort: 'high' });
  assert.equal(high.usage.prompt_tokens - low.usage.prompt_tokens, 1); // "high" vs "low", a byte a token
  const bad = await postJSON(srv.base, '/v1/chat/completions', { model: 'reason', messages: HI,
    reasoning_effort: 'extreme' });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'reasoning_effort');
  const clash = await postJSON(srv.base, '/v1/chat/completions', { model: 'reason', messages: HI,
    reasoning_effort: 'low', chat_template_kwargs: { reasoning_effort: 'high' } });
  assert.equal(clash.status, 400);
});

test("an earlier turn's reasoning_content is the template's message.thinking", async () => {
  const call = { id: 'call12345', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } };
  const turns = (extra) => [{ role: 'user', content: 'Weather?' },
    { role: 'assistant', content: '', tool_calls: [call], ...extra },
    { role: 'tool', tool_call_id: 'call12345', content: '{"t": 22}' }];
  const want = '<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions.get_weather';
  for (const extra of [{ reasoning_content: 'Need the tool.' }, { reasoning: 'Need the tool.' },
    { thinking: 'Need the tool.' }])
    assert.ok((await rendered({ messages: turns(extra), tools: [WEATHER] })).includes(want), JSON.stringify(extra));
  assert.ok(!(await rendered({ messages: turns({}), tools: [WEATHER] })).includes('<|channel|>analysis'));
  // the content of a call turn with reasoning is dropped: the template refuses both at once
  const both = await rendered({ messages: turns({ content: 'Let me look.', reasoning_content: 'Need the tool.' }),
    tools: [WEATHER] });
  assert.ok(both.includes(want) && !both.includes('Let me look.'));
});

test('Anthropic: a thinking block and a text block; budget_tokens closes the analysis', async () => {
  const client = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const m = await client.messages.create({ model: 'reason', max_tokens: 64, temperature: 0, messages: HI });
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text'], JSON.stringify(m));
  assert.equal(m.content[0].thinking, 'Hmm let me think.');
  assert.equal(m.content[1].text, 'Hello world');
  const cut = await client.messages.create({ model: 'reason', max_tokens: 64, temperature: 0, messages: HI,
    thinking: { type: 'enabled', budget_tokens: 1 } });
  assert.equal(cut.content[0].thinking, 'Hmm', JSON.stringify(cut));
  assert.equal(cut.content[1].text, 'Hello world');
  const t = await client.messages.create({ model: 'tool', max_tokens: 64, temperature: 0, messages: HI,
    tools: [{ name: 'get_weather', description: 'Weather', input_schema: WEATHER.function.parameters }] });
  assert.equal(t.stop_reason, 'tool_use', JSON.stringify(t));
  const use = t.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Paris' });
});

test('Ollama: thinking and content, streamed too; a think level is the reasoning effort', async () => {
  const ollama = new Ollama({ host: srv.base });
  const r = await ollama.chat({ model: 'reason', messages: HI, think: 'low', options: { temperature: 0 } });
  assert.equal(r.message.thinking, 'Hmm let me think.');
  assert.equal(r.message.content, 'Hello world');
  let thinking = '', content = '';
  for await (const part of await ollama.chat({ model: 'reason', messages: HI, stream: true, options: { temperature: 0 } })) {
    thinking += part.message.thinking ?? '';
    content += part.message.content;
  }
  assert.equal(thinking, 'Hmm let me think.');
  assert.equal(content, 'Hello world');
  const low = await ollama.chat({ model: 'reason', messages: HI, think: 'low', options: { temperature: 0 } });
  const high = await ollama.chat({ model: 'reason', messages: HI, think: 'high', options: { temperature: 0 } });
  assert.equal(high.prompt_eval_count - low.prompt_eval_count, 1);
  const t = await ollama.chat({ model: 'tool', messages: HI, tools: [WEATHER], options: { temperature: 0 } });
  assert.equal(t.message.tool_calls?.[0]?.function.name, 'get_weather', JSON.stringify(t));
  assert.deepEqual(t.message.tool_calls[0].function.arguments, { city: 'Paris' });
});

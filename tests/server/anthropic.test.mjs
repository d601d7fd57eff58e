// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) driven by the official
// @anthropic-ai/sdk: create, stream, a tool round trip, count_tokens, thinking blocks on the
// Qwen3 fixture, stop sequences, prefix-cache reads, model aliases and errors in Anthropic's
// shape. The server has a key, so every SDK call also checks x-api-key.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, postJSON, DEFAULT, QWEN } from './lib.mjs';

const KEY = 'sk-test-anthropic';
let srv, client;
const auth = { authorization: `Bearer ${KEY}` };

before(async () => {
  srv = await startServer(['--model', DEFAULT, '--model', QWEN, '--max-resident', '2',
    '--device', 'cpu', '--api-key', KEY, '--alias', 'claude-*=default', '--alias', 'small=qwen']);
  client = new Anthropic({ baseURL: srv.base, apiKey: KEY, maxRetries: 0, timeout: 60000 });
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const tokenize = async (body) => (await postJSON(srv.base, '/tokenize', body, auth)).json.tokens;

test('create and stream: the same greedy text, usage, stop reasons, aliases', async () => {
  const body = { model: 'claude-sonnet-4-5', max_tokens: 12, temperature: 0, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hello there' }] };
  const m = await client.messages.create(body);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'default', 'the alias reached the default model');
  assert.match(m.id, /^msg_/);
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.content[0].text.length > 0);
  assert.equal(m.usage.output_tokens, 12);
  const prompt = await tokenize({ model: 'default', messages: [{ role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hello there' }] });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, prompt.length);

  const final = await client.messages.stream(body).finalMessage();
  assert.deepEqual(final.content, m.content, 'streamed text equals the whole one');
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 12);
  // the events on the wire, each "event: T" with data of that "type"
  const raw = await postJSON(srv.base, '/v1/messages', { ...body, stream: true }, auth);
  assert.match(raw.headers.get('content-type'), /text\/event-stream/);
  const events = raw.text.trim().split('\n\n').map((e) => {
    const [, type, data] = e.match(/^event: (\w+)\ndata: (.*)$/);
    assert.equal(JSON.parse(data).type, type);
    return type;
  });
  assert.deepEqual(events.slice(0, 3), ['message_start', 'ping', 'content_block_start']);
  assert.deepEqual(events.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(events.filter((t) => t === 'content_block_delta').length, 12);

  // a stop sequence cut from the greedy answer: the text ends before it, and says which
  const word = m.content[0].text.trim().split(/\s+/).at(-1);
  const cut = await client.messages.create({ ...body, stop_sequences: ['zzqx', word] });
  assert.equal(cut.stop_reason, 'stop_sequence', JSON.stringify(cut));
  assert.equal(cut.stop_sequence, word);
  assert.ok(m.content[0].text.startsWith(cut.content[0]?.text ?? ''));

  // `?beta=true` (Claude Code's) and a bearer key are the same route
  const beta = await postJSON(srv.base, '/v1/messages?beta=true', body, auth);
  assert.equal(beta.status, 200, beta.text);
  assert.deepEqual(beta.json.content, m.content);
});

test('an assistant message last is a prefill: the reply continues it', async () => {
  const messages = [{ role: 'user', content: 'Say something' }, { role: 'assistant', content: 'In the beginning' }];
  const m = await client.messages.create({ model: 'default', max_tokens: 6, temperature: 0, messages });
  const chat = await postJSON(srv.base, '/v1/chat/completions',
    { model: 'default', messages, continue_final_message: true, max_tokens: 6, temperature: 0 }, auth);
  assert.equal(chat.status, 200, chat.text);
  assert.equal(m.content[0].text, chat.json.choices[0].message.content);
  const t = await postJSON(srv.base, '/apply-template', { model: 'default', messages, continue_final_message: true }, auth);
  assert.ok(t.json.prompt.endsWith('In the beginning'), t.text);
});

test('prefix-cache hits are cache_read_input_tokens', async () => {
  const long = 'The quick brown fox jumps over the lazy dog. '.repeat(20);
  const body = { model: 'default', max_tokens: 2, temperature: 0,
    messages: [{ role: 'user', content: long }], metadata: { user_id: 'u1' } };
  const a = await client.messages.create(body);
  const b = await client.messages.create(body);
  assert.ok(b.usage.cache_read_input_tokens > 0, JSON.stringify(b.usage));
  assert.equal(a.usage.input_tokens + a.usage.cache_read_input_tokens,
    b.usage.input_tokens + b.usage.cache_read_input_tokens);
  assert.equal(b.usage.cache_creation_input_tokens, 0);
  // a stream's message_start says the same split as its message_delta and the whole reply
  const raw = await postJSON(srv.base, '/v1/messages', { ...body, stream: true }, auth);
  const events = raw.text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
  const start = events.find((e) => e.type === 'message_start').message.usage;
  const delta = events.find((e) => e.type === 'message_delta').usage;
  assert.ok(start.cache_read_input_tokens > 0, JSON.stringify(start));
  for (const k of ['input_tokens', 'cache_read_input_tokens'])
    assert.equal(start[k], delta[k], `${k}: ${JSON.stringify(start)} ${JSON.stringify(delta)}`);
});

const weather = { name: 'get_weather', description: 'Weather forecast', strict: true,
  input_schema: { type: 'object', properties: { days: { type: 'integer' } }, required: ['days'] } };

test('tool round trip: a forced tool_use, its tool_result back into the prompt', async () => {
  const body = { model: 'default', max_tokens: 64, temperature: 0, tools: [weather],
    tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Weather in Paris?', cache_control: { type: 'ephemeral' } }] }] };
  const m = await client.messages.create(body);
  assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.ok(Number.isInteger(use.input.days), JSON.stringify(use));
  assert.equal(typeof use.id, 'string');

  const streamed = await client.messages.stream(body).finalMessage();
  assert.equal(streamed.stop_reason, 'tool_use');
  const { id, ...same } = streamed.content.find((b) => b.type === 'tool_use');
  assert.deepEqual({ ...same, id: use.id }, use);
  assert.notEqual(id, use.id, 'each call its own id');

  const turn = { ...body, tool_choice: { type: 'auto' }, max_tokens: 4, messages: [...body.messages,
    { role: 'assistant', content: m.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '{"forecast":"sunny"}' },
      { type: 'text', text: 'Thanks' }] }] };
  const next = await client.messages.create(turn);
  assert.equal(next.type, 'message');
  // the prompt is the chat route's for the same conversation
  const { input_tokens } = await client.messages.countTokens({ model: 'default', tools: [weather], messages: turn.messages });
  const openai = await tokenize({ model: 'default', tools: [{ type: 'function', function: {
    name: 'get_weather', description: 'Weather forecast', strict: true, parameters: weather.input_schema } }],
  messages: [{ role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: '', tool_calls: [{ id: use.id, type: 'function', function: { name: 'get_weather', arguments: use.input } }] },
    { role: 'tool', tool_call_id: use.id, content: '{"forecast":"sunny"}' }, { role: 'user', content: 'Thanks' }] });
  assert.equal(input_tokens, openai.length);
});

// The rules of include/atlas/reasoning.h for a reply whose prompt did not open the block.
function split(raw) {
  const ws = /^[ \n\r\t]*/;
  const lead = raw.match(ws)[0].length;
  if (!raw.startsWith('<think>', lead)) return { reasoning: '', content: raw };
  const rest = raw.slice(lead + 7);
  const k = rest.indexOf('</think>');
  if (k < 0) return { reasoning: rest.trim(), content: '' };
  return { reasoning: rest.slice(0, k).trim(), content: rest.slice(k + 8).replace(ws, '') };
}

test('thinking blocks with signatures, streamed and whole; sent back and accepted', async () => {
  // The fixture Qwen3 never thinks by itself: biased towards both tags with a seed (atlas's
  // extensions of Messages), it writes a seeded mix; /v1/completions on the same prompt gives
  // the raw text to split by the rules.
  const messages = [{ role: 'user', content: 'Why is the sky blue?' }];
  const logit_bias = { 151667: 10, 151668: 10 };
  const prompt = (await postJSON(srv.base, '/apply-template', { model: 'qwen', messages }, auth)).json.prompt;
  let thought = 0;
  for (let seed = 1; seed <= 12 && (seed <= 3 || !thought); seed++) {
    const raw = (await postJSON(srv.base, '/v1/completions', { model: 'qwen', prompt, max_tokens: 24,
      temperature: 1, seed, logit_bias }, auth)).json.choices[0].text;
    const want = split(raw);
    const body = { model: 'small', max_tokens: 24, temperature: 1, seed, logit_bias, messages,
      thinking: { type: 'enabled', budget_tokens: 1024 } };
    for (const m of [await client.messages.create(body), await client.messages.stream(body).finalMessage()]) {
      const th = m.content.filter((b) => b.type === 'thinking');
      const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
      assert.equal(th.map((b) => b.thinking).join(''), want.reasoning, `seed ${seed}: ${JSON.stringify(raw)}`);
      assert.equal(text, want.content, `seed ${seed}`);
      for (const b of th) assert.match(b.signature, /^atlas-[0-9a-f]{16}$/);
      if (th.length) assert.equal(m.content[0].type, 'thinking', 'thinking comes first');
    }
    if (want.reasoning) thought++;
  }
  assert.ok(thought > 0, 'some seed thought');

  // thinking, its signature and redacted thinking sent back: the thinking goes into the
  // prompt as the template expects a reasoning_content (the assistant message last is a
  // prefill, the chat route's continue_final_message)
  const back = [...messages, { role: 'assistant', content: [
    { type: 'thinking', thinking: 'Rayleigh scattering.', signature: 'whatever' },
    { type: 'redacted_thinking', data: 'opaque' }, { type: 'text', text: 'Scattering.' }] }];
  const counted = await client.messages.countTokens({ model: 'small', messages: back });
  const openai = await tokenize({ model: 'qwen', continue_final_message: true, messages: [...messages,
    { role: 'assistant', content: 'Scattering.', reasoning_content: 'Rayleigh scattering.' }] });
  assert.equal(counted.input_tokens, openai.length);
  const bare = await tokenize({ model: 'qwen', continue_final_message: true,
    messages: [...messages, { role: 'assistant', content: 'Scattering.' }] });
  assert.ok(openai.length > bare.length, 'the thinking is in the prompt');
  const withThought = await client.messages.create({ model: 'small', max_tokens: 2, messages: back });
  assert.equal(withThought.type, 'message');

  // thinking disabled: Qwen3's template closes an empty block in the prompt itself
  const off = await client.messages.countTokens({ model: 'small', messages, thinking: { type: 'disabled' } });
  const on = await client.messages.countTokens({ model: 'small', messages });
  assert.ok(off.input_tokens > on.input_tokens, `${off.input_tokens} > ${on.input_tokens}`);
});

test('budget_tokens closes the think block after that many tokens', async () => {
  // The same biased, seeded runs as above: a budget changes nothing before it is spent (the
  // tokens are the same seed's), so the thinking with a budget of B is the split of the first
  // B tokens inside the block the free run opened, the closing tag forced after them; the
  // reply then goes on as text. /v1/completions names the free run's tokens by id.
  const messages = [{ role: 'user', content: 'Why is the sky blue?' }];
  const logit_bias = { 151667: 11, 151668: 10 }; // opening a little likelier
  const B = 3, max = 24;
  const prompt = (await postJSON(srv.base, '/apply-template', { model: 'qwen', messages }, auth)).json.prompt;
  const detok = async (tokens) => (await postJSON(srv.base, '/detokenize', { model: 'qwen', tokens }, auth)).json.prompt;
  let cut = 0, whole = 0;
  for (let seed = 1; seed <= 60 && (cut < 2 || whole < 1); seed++) {
    const c = (await postJSON(srv.base, '/v1/completions', { model: 'qwen', prompt, max_tokens: max,
      temperature: 1, seed, logit_bias, logprobs: 1, return_tokens_as_token_ids: true }, auth)).json.choices[0];
    const ids = c.logprobs.tokens.map((t) => Number(t.slice(9)));
    const free = split(c.text);
    const open = ids.indexOf(151667);
    if (!free.reasoning && !c.text.trimStart().startsWith('<think>')) continue; // no block
    const inside = ids.slice(open + 1, open + 1 + B);
    const forced = open + 1 + B < max && !inside.includes(151668);
    const want = forced ? split(`${await detok(ids.slice(0, open + 1 + B))}</think>`).reasoning : free.reasoning;
    const body = { model: 'small', max_tokens: max, temperature: 1, seed, logit_bias, messages,
      thinking: { type: 'enabled', budget_tokens: B } };
    for (const m of [await client.messages.create(body), await client.messages.stream(body).finalMessage()]) {
      const th = m.content.filter((b) => b.type === 'thinking').map((b) => b.thinking).join('');
      assert.equal(th, want, `seed ${seed}: ${JSON.stringify(c.text)}`);
      assert.ok(free.reasoning.startsWith(th), `seed ${seed}: a prefix of the free thinking`);
      if (!forced) continue;
      assert.equal(m.content[0].type, 'thinking');
      assert.equal(m.content.at(-1).type, 'text', `seed ${seed}: a text block follows`);
      assert.ok(m.content.at(-1).text.length > 0);
      const count = async (text) => (await postJSON(srv.base, '/tokenize', { model: 'qwen', prompt: text, add_special_tokens: false }, auth)).json.tokens.length;
      // re-encoding may split differently: as much as the B ids' own text does (the random
      // fixture draws ids that BPE would not make, such as a whole Thai word), trimmed as the
      // thinking block is (" yüksel" is one id, "yüksel" two)
      const text = (await detok(inside)).trim();
      const n = await count(th), nb = await count(text);
      assert.ok(n <= Math.max(B, nb) + 1,
        `seed ${seed}: ${n} tokens of thinking ${JSON.stringify(th)} (the ${B} ids' text: ${nb}, ${JSON.stringify(text)})`);
    }
    if (forced && want !== free.reasoning) cut++;
    else whole++;
  }
  assert.ok(cut >= 2, `some seed's thinking was cut (${cut})`);
  assert.ok(whole >= 1, `some seed's thinking ended within the budget (${whole})`);
});

test('errors in Anthropic\'s shape, through the SDK and by hand', async () => {
  await assert.rejects(client.messages.create({ model: 'default', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.type === 'error' &&
      e.error.error.type === 'invalid_request_error' && /max_tokens/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model: 'nope', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
  const img = await postJSON(srv.base, '/v1/messages', { model: 'default', max_tokens: 2, messages: [{ role: 'user',
    content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }, auth);
  assert.equal(img.status, 400);
  assert.equal(img.json.error.type, 'invalid_request_error');
  assert.match(img.json.error.message, /image blocks are not supported/);
  const doc = await client.messages.countTokens({ model: 'default', messages: [{ role: 'user',
    content: [{ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'x' } }] }] }).catch((e) => e);
  assert.ok(doc instanceof Anthropic.BadRequestError && /document blocks/.test(doc.error.error.message));
  const bad = new Anthropic({ baseURL: srv.base, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: 'default', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
  const json = await postJSON(srv.base, '/v1/messages', '{"model":', auth);
  assert.equal(json.status, 400);
  assert.deepEqual(Object.keys(json.json), ['type', 'error']);
  const server = await postJSON(srv.base, '/v1/messages', { model: 'default', max_tokens: 2,
    messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, auth);
  assert.equal(server.status, 400);
  assert.match(server.json.error.message, /web_search_20250305/);
  // the OpenAI routes keep OpenAI's shape
  const oa = await postJSON(srv.base, '/v1/chat/completions', { model: 'nope', messages: [] }, auth);
  assert.equal(oa.json.error.code, 'model_not_found');
});

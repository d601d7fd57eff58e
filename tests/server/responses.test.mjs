// OpenAI's Responses API through the official Node SDK (responses create / stream / retrieve
// / delete / input items, previous_response_id, function tools, text.format, reasoning): each
// answer must be the chat route's answer to the same conversation (greedy, or the same seed),
// as the Responses route is a translation onto it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, getJSON, DEFAULT, QWEN } from './lib.mjs';

let srv, qwen, small;
before(async () => {
  [srv, qwen, small] = await Promise.all([
    startServer(['--model', DEFAULT, '--device', 'cpu', '--parallel', '4']),
    startServer(['--model', QWEN, '--device', 'cpu']),
    startServer(['--model', DEFAULT, '--device', 'cpu', '--responses-max', '2', '--responses-ttl', '2']),
  ]);
});
after(async () => {
  for (const s of [srv, qwen, small]) {
    const r = await s.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${s.log()}`);
  }
});

const chat = async (s, messages, extra = {}) => {
  const r = await postJSON(s.base, '/v1/chat/completions', { messages, temperature: 0, max_tokens: 12, ...extra });
  assert.equal(r.status, 200, r.text);
  return r.json;
};
const messageText = (resp) => resp.output.filter((i) => i.type === 'message')
  .flatMap((i) => i.content).map((p) => p.text).join('');

test('create: the chat answer as a response object, kept for retrieve and input_items', async () => {
  const client = srv.client();
  const r = await client.responses.create({
    model: 'default', instructions: 'Answer briefly.', input: 'Where is Paris?', temperature: 0,
    max_output_tokens: 12, metadata: { k: 'v' },
  });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  const c = await chat(srv, [{ role: 'system', content: 'Answer briefly.' }, { role: 'user', content: 'Where is Paris?' }]);
  assert.equal(r.output_text, c.choices[0].message.content);
  assert.equal(r.status, c.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  if (r.status === 'incomplete') assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, c.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.instructions, 'Answer briefly.');
  assert.deepEqual(r.metadata, { k: 'v' });
  assert.equal(r.model, 'default');

  const got = await client.responses.retrieve(r.id);
  assert.deepEqual(got.output, r.output);
  const items = await client.responses.inputItems.list(r.id);
  assert.equal(items.data.length, 1);
  assert.equal(items.data[0].role, 'user');
  assert.equal(items.data[0].content[0].text, 'Where is Paris?');

  const del = await client.responses.delete(r.id);
  assert.deepEqual(del, { id: r.id, object: 'response', deleted: true });
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
  const raw = await fetch(`${srv.base}/v1/responses/${r.id}`, { method: 'DELETE' });
  assert.equal(raw.status, 404);
  assert.equal((await raw.json()).error.type, 'invalid_request_error');
});

test('stream: typed events in sequence, accumulated by the SDK into the same response', async () => {
  const client = srv.client();
  const req = { model: 'default', input: 'Tell me a story.', temperature: 0, max_output_tokens: 16 };
  const whole = await client.responses.create(req);
  const stream = client.responses.stream(req);
  const types = [];
  let seq = 0, deltas = '';
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq++, ev.type);
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  }
  const fin = await stream.finalResponse();
  assert.equal(fin.output_text, whole.output_text);
  assert.equal(deltas, whole.output_text);
  const parts = (resp) => resp.output[0].content.map((p) => ({ type: p.type, text: p.text }));
  assert.deepEqual(parts(fin), parts(whole));
  const end = whole.status === 'completed' ? 'response.completed' : 'response.incomplete';
  assert.deepEqual([...new Set(types)], ['response.created', 'response.in_progress',
    'response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
    'response.output_text.done', 'response.content_part.done', 'response.output_item.done', end]);
  // the streamed response was kept as it ended
  const got = await client.responses.retrieve(fin.id);
  assert.equal(got.status, whole.status);
  assert.deepEqual(parts(got), parts(whole));
});

test('previous_response_id continues the stored conversation; store false keeps nothing', async () => {
  const client = srv.client();
  const r1 = await client.responses.create({ model: 'default', input: 'Hello.', temperature: 0, max_output_tokens: 8 });
  const r2 = await client.responses.create({
    model: 'default', input: [{ role: 'user', content: 'And then?' }], previous_response_id: r1.id,
    temperature: 0, max_output_tokens: 8,
  });
  const c = await chat(srv, [{ role: 'user', content: 'Hello.' }, { role: 'assistant', content: r1.output_text },
    { role: 'user', content: 'And then?' }], { max_tokens: 8 });
  assert.equal(r2.output_text, c.choices[0].message.content);
  assert.equal(r2.usage.input_tokens, c.usage.prompt_tokens);
  assert.equal(r2.previous_response_id, r1.id);
  const items = await client.responses.inputItems.list(r2.id, { order: 'asc' });
  assert.deepEqual(items.data.map((i) => i.content[0].text), ['And then?']);

  const off = await client.responses.create({ model: 'default', input: 'Hi.', store: false, max_output_tokens: 4 });
  assert.equal(off.store, false);
  await assert.rejects(client.responses.retrieve(off.id), (e) => e.status === 404);
  await assert.rejects(client.responses.create({ model: 'default', input: 'x', previous_response_id: off.id }),
    (e) => e.status === 400 && e.param === 'previous_response_id');
});

const WEATHER = {
  type: 'function', name: 'get_weather', strict: true,
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                required: ['city', 'days'], additionalProperties: false },
};

test('function tools: a forced call, streamed and whole, then its output sent back', async () => {
  const client = srv.client();
  const req = { model: 'default', input: 'Weather in Paris?', tools: [WEATHER], temperature: 0,
                tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 200,
                logit_bias: await closers() };
  const r = await client.responses.create(req);
  const call = r.output.find((i) => i.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  assert.match(call.call_id, /./);
  const args = JSON.parse(call.arguments);
  assert.equal(typeof args.city, 'string');
  assert.ok(Number.isInteger(args.days));
  const c = await chat(srv, [{ role: 'user', content: 'Weather in Paris?' }], {
    max_tokens: 200, logit_bias: req.logit_bias, tools: [{ type: 'function', function: { ...WEATHER, type: undefined } }],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  assert.equal(call.arguments, c.choices[0].message.tool_calls[0].function.arguments);

  const stream = client.responses.stream(req);
  const types = new Set();
  let argDeltas = '';
  for await (const ev of stream) {
    types.add(ev.type);
    if (ev.type === 'response.function_call_arguments.delta') argDeltas += ev.delta;
  }
  const fin = await stream.finalResponse();
  assert.ok(types.has('response.function_call_arguments.done'));
  const fcall = fin.output.find((i) => i.type === 'function_call');
  assert.equal(fcall.arguments, call.arguments);
  assert.equal(argDeltas, call.arguments);

  // the round trip: the call's output goes back with previous_response_id
  const r2 = await client.responses.create({
    model: 'default', previous_response_id: r.id, temperature: 0, max_output_tokens: 8, tools: [WEATHER],
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"sky": "clear"}' }],
  });
  const c2 = await chat(srv, [{ role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: '', tool_calls: [{ id: call.call_id, type: 'function', function: { name: 'get_weather', arguments: call.arguments } }] },
    { role: 'tool', tool_call_id: call.call_id, content: '{"sky": "clear"}' }],
  { max_tokens: 8, tools: [{ type: 'function', function: { ...WEATHER, type: undefined } }] });
  assert.equal(r2.usage.input_tokens, c2.usage.prompt_tokens);
  assert.equal(r2.output_text, c2.choices[0].message.content ?? '');
});

test('text.format json_schema is held by the constraint; bad input is a 400 naming the field', async () => {
  const client = srv.client();
  const r = await client.responses.create({
    model: 'default', input: 'A city, as JSON.', temperature: 1, seed: 3, max_output_tokens: 300,
    text: { format: { type: 'json_schema', name: 'c', strict: true,
      schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false } } },
    logit_bias: await closers(),
  });
  assert.equal(typeof JSON.parse(r.output_text).city, 'string', r.output_text);

  const bad = async (body, param, re) => {
    const x = await postJSON(srv.base, '/v1/responses', { model: 'default', ...body });
    assert.equal(x.status, 400, x.text);
    assert.equal(x.json.error.type, 'invalid_request_error');
    assert.equal(x.json.error.param, param, x.text);
    if (re) assert.match(x.json.error.message, re);
  };
  await bad({ input: 'x', text: { format: { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'string', pattern: 'a' } } } } } },
    'text.format', /text\.format\.schema\.properties\.a\.pattern/);
  await bad({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x' }] }] }, 'input', /input_image/);
  await bad({ input: [{ type: 'web_search_call', id: 'w' }] }, 'input', /web_search_call/);
  await bad({ input: 'x', tools: [{ type: 'web_search' }] }, 'tools', /web_search/);
  await bad({ input: 7 }, 'input');
  await bad({}, 'input');
  await bad({ input: 'x', max_output_tokens: 0 }, 'max_output_tokens', /^'max_output_tokens'/);
  await bad({ input: [] }, 'input', /^'input' must be a non-empty array/);
  await bad({ input: 'x', top_logprobs: 3 }, 'top_logprobs');
  await bad({ input: 'x', max_tool_calls: 2 }, 'max_tool_calls');
  await bad({ input: 'x', background: true }, 'background');
  await bad({ input: 'x', tool_choice: 'required' }, 'tool_choice');
});

// Biases towards closing tokens, so that a schema's JSON ends within a few hundred tokens.
async function closers() {
  const bias = {};
  for (const [s, b] of [['"', 30], ['}', 12]]) {
    const t = (await postJSON(srv.base, '/tokenize', { prompt: s, add_special_tokens: false })).json.tokens;
    bias[t[0]] = b;
  }
  return bias;
}

test('reasoning (Qwen3): the think block as a reasoning item, and replayed into the prompt', async () => {
  const client = qwen.client();
  const BIAS = { 151667: 10, 151668: 10 }; // <think>, </think>: the random model then thinks
  let found = false;
  for (let seed = 1; seed <= 12 && !found; seed++) {
    const req = { model: 'qwen', input: 'Why is the sky blue?', temperature: 1, seed, logit_bias: BIAS, max_output_tokens: 24 };
    const r = await client.responses.create(req);
    const c = await chat(qwen, [{ role: 'user', content: 'Why is the sky blue?' }],
      { temperature: 1, seed, logit_bias: BIAS, max_tokens: 24 });
    const m = c.choices[0].message;
    const rs = r.output.find((i) => i.type === 'reasoning');
    assert.equal(rs?.content[0].text ?? '', m.reasoning_content ?? '', `seed ${seed}`);
    assert.equal(r.output_text, m.content ?? '', `seed ${seed}`);
    if (!rs) continue;
    found = true;
    const stream = client.responses.stream(req);
    let thought = '';
    for await (const ev of stream) if (ev.type === 'response.reasoning_text.delta') thought += ev.delta;
    assert.equal(thought, rs.content[0].text);
    const shape = (out) => out.map((i) => ({ type: i.type, text: i.content.map((p) => p.text) }));
    assert.deepEqual(shape((await stream.finalResponse()).output), shape(r.output));
  }
  assert.ok(found, 'a seed makes the model think');

  // a replayed turn: reasoning (with encrypted_content, as clients send it back), a call and
  // its output; the chain of thought goes where Qwen3's template puts it
  const input = [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'reasoning', id: 'rs_1', summary: [], encrypted_content: 'opaque',
      content: [{ type: 'reasoning_text', text: 'I should call the tool.' }] },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city": "Paris", "days": 1}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'sunny' },
  ];
  const r = await client.responses.create({ model: 'qwen', input, tools: [WEATHER], max_output_tokens: 1 });
  const messages = [{ role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: '', reasoning_content: 'I should call the tool.',
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 1}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny' }];
  const tools = [{ type: 'function', function: { ...WEATHER, type: undefined } }];
  const prompt = (await postJSON(qwen.base, '/apply-template', { model: 'qwen', messages, tools })).json.prompt;
  assert.ok(prompt.includes('<think>\nI should call the tool.\n</think>'), prompt);
  const tok = await postJSON(qwen.base, '/tokenize', { model: 'qwen', messages, tools });
  assert.equal(r.usage.input_tokens, tok.json.tokens.length);
});

test('the store is bounded by --responses-max and --responses-ttl', async () => {
  const client = small.client();
  const ids = [];
  for (let i = 0; i < 3; i++)
    ids.push((await client.responses.create({ model: 'default', input: `n${i}`, max_output_tokens: 1 })).id);
  await assert.rejects(client.responses.retrieve(ids[0]), (e) => e.status === 404);
  assert.equal((await client.responses.retrieve(ids[2])).id, ids[2]);
  await new Promise((res) => setTimeout(res, 2300));
  assert.equal((await getJSON(small.base, `/v1/responses/${ids[2]}`)).status, 404);
});

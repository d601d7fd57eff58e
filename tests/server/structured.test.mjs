// Structured output through the official Node SDK: response_format json_object (chat and
// completions) and json_schema, tool_choice "required" / a named function, enforced by
// constrained decoding, streamed and not; the requests atlas refuses.
//
// The fixture models have random weights: inside a JSON string they may write thousands of
// tokens before a quote.  The requests therefore carry a logit_bias towards a few closing
// tokens (quote, braces, ...): the constraint still decides which tokens are possible at
// each step (a biased token that does not fit is never taken), the bias only makes the
// output end within max_tokens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, LLAMA, QWEN } from './lib.mjs';

let srv, client;
const bias = {};
before(async () => {
  srv = await startServer(['--model', LLAMA, '--model', QWEN, '--parallel', '4']);
  client = srv.client();
  for (const model of ['llama', 'qwen']) {
    bias[model] = {};
    for (const s of ['"', '}', ']', '":', '1', '"}', ',']) {
      const t = (await postJSON(srv.base, '/tokenize', { model, prompt: s, add_special_tokens: false })).json.tokens;
      if (t.length === 1) bias[model][t[0]] = 8;
    }
    assert.ok(Object.keys(bias[model]).length >= 5, `closing tokens of ${model}`);
  }
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  { type: 'function', function: { name: 'get_time', description: 'Time of day', parameters: { type: 'object', properties: {} } } },
];

function body(model, extra = {}) {
  return {
    model, messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    temperature: 1, seed: 3, max_tokens: 1000, logit_bias: bias[model], ...extra,
  };
}

function isObject(x) { return x !== null && typeof x === 'object' && !Array.isArray(x); }

test('response_format json_object: the content is one JSON object', async () => {
  for (const model of ['qwen', 'llama']) {
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.create(body(model, { seed, response_format: { type: 'json_object' } }));
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', JSON.stringify(r));
      assert.ok(isObject(JSON.parse(c.message.content)), c.message.content);
      assert.ok(!c.message.tool_calls || c.message.tool_calls.length === 0);
    }
  }
  // streamed: the pieces join into an object too
  const stream = await client.chat.completions.create(body('qwen', { seed: 5, stream: true, response_format: { type: 'json_object' } }));
  let text = '', finish = null;
  for await (const ch of stream) {
    if (ch.choices.length && ch.choices[0].delta.content) text += ch.choices[0].delta.content;
    if (ch.choices.length && ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.equal(finish, 'stop');
  assert.ok(isObject(JSON.parse(text)), text);
  // {"type": "text"} is the default: accepted, unconstrained
  const t = await client.chat.completions.create(body('qwen', { max_tokens: 4, response_format: { type: 'text' } }));
  assert.ok(['stop', 'length'].includes(t.choices[0].finish_reason));
});

test('response_format json_schema: the content follows the schema', async () => {
  const schema = {
    type: 'object',
    properties: {
      city: { type: 'string' }, days: { type: 'integer' }, temp: { type: 'number' },
      sunny: { type: 'boolean' }, unit: { enum: ['C', 'F'] }, tags: { type: 'array', items: { type: 'string' } },
      note: { anyOf: [{ type: 'string' }, { type: 'null' }] },
      where: { type: 'object', properties: { lat: { type: 'number' }, name: { const: 'x' } } },
    },
    required: ['city', 'days', 'temp', 'sunny', 'unit', 'tags', 'note', 'where'], additionalProperties: false,
  };
  for (const [model, seed] of [['qwen', 1], ['llama', 2]]) {
    const r = await client.chat.completions.create(body(model, {
      seed, response_format: { type: 'json_schema', json_schema: { name: 'forecast', strict: true, schema } },
    }));
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(r));
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v), ['city', 'days', 'temp', 'sunny', 'unit', 'tags', 'note', 'where'], c.message.content);
    assert.equal(typeof v.city, 'string');
    assert.ok(Number.isInteger(v.days), c.message.content);
    assert.equal(typeof v.temp, 'number');
    assert.equal(typeof v.sunny, 'boolean');
    assert.ok(['C', 'F'].includes(v.unit));
    assert.ok(Array.isArray(v.tags) && v.tags.every((t) => typeof t === 'string'), c.message.content);
    assert.ok(v.note === null || typeof v.note === 'string');
    assert.deepEqual(Object.keys(v.where), ['lat', 'name']);
    assert.equal(typeof v.where.lat, 'number');
    assert.equal(v.where.name, 'x');
  }
});

test('response_format json_object on /v1/completions', async () => {
  const r = await client.completions.create({
    model: 'llama', prompt: 'A JSON object:', temperature: 1, seed: 4, max_tokens: 1000,
    logit_bias: bias.llama, response_format: { type: 'json_object' },
  });
  assert.equal(r.choices[0].finish_reason, 'stop', JSON.stringify(r));
  assert.ok(isObject(JSON.parse(r.choices[0].text)), r.choices[0].text);
});

test('tool_choice naming a function: exactly one call of it, finish_reason tool_calls', async () => {
  for (const model of ['qwen', 'llama']) {
    const r = await client.chat.completions.create(body(model, {
      tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_time' } },
    }));
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(r));
    assert.equal(c.message.tool_calls.length, 1, JSON.stringify(r));
    const tc = c.message.tool_calls[0];
    assert.equal(tc.type, 'function');
    assert.equal(tc.function.name, 'get_time');
    assert.ok(isObject(JSON.parse(tc.function.arguments)), tc.function.arguments);
    assert.ok(!c.message.content, `no text beside the call: ${JSON.stringify(c.message.content)}`);
  }
});

test('a strict named function: its arguments follow its parameters', async () => {
  const strict = {
    type: 'function', function: {
      name: 'book', strict: true,
      parameters: { type: 'object', properties: { city: { type: 'string' }, nights: { type: 'integer' }, smoking: { type: 'boolean' } }, required: ['city', 'nights', 'smoking'], additionalProperties: false },
    },
  };
  for (const model of ['qwen', 'llama']) {
    const r = await client.chat.completions.create(body(model, {
      seed: 6, tools: [...TOOLS, strict], tool_choice: { type: 'function', function: { name: 'book' } },
    }));
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(r));
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].function.name, 'book');
    const a = JSON.parse(c.message.tool_calls[0].function.arguments);
    assert.deepEqual(Object.keys(a), ['city', 'nights', 'smoking'], JSON.stringify(a));
    assert.equal(typeof a.city, 'string');
    assert.ok(Number.isInteger(a.nights));
    assert.equal(typeof a.smoking, 'boolean');
  }
  // a strict schema atlas cannot enforce is refused, naming it
  const bad = { type: 'function', function: { ...strict.function, parameters: { type: 'object', properties: { city: { type: 'string', minLength: 2 } } } } };
  const r = await postJSON(srv.base, '/v1/chat/completions', body('qwen', { tools: [bad], tool_choice: { type: 'function', function: { name: 'book' } } }));
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'tools');
  assert.match(r.json.error.message, /tools\[0\]\.function\.parameters\.properties\.city\.minLength/);
});

test('tool_choice "required": one call of one of the tools', async () => {
  for (const [model, seed] of [['qwen', 7], ['llama', 8]]) {
    const r = await client.chat.completions.create(body(model, { seed, tools: TOOLS, tool_choice: 'required' }));
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(r));
    assert.equal(c.message.tool_calls.length, 1);
    assert.ok(['get_weather', 'get_time'].includes(c.message.tool_calls[0].function.name));
    assert.ok(isObject(JSON.parse(c.message.tool_calls[0].function.arguments)));
  }
});

test('tool_choice naming a function, streamed', async () => {
  const stream = client.chat.completions.stream(body('qwen', {
    seed: 9, stream: true, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } },
  }));
  const final = await stream.finalChatCompletion();
  const c = final.choices[0];
  assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(final));
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  assert.ok(isObject(JSON.parse(c.message.tool_calls[0].function.arguments)));
});

test('refused: unknown function, forced choice without tools, unknown formats', async () => {
  const expect400 = async (extra, param, re) => {
    const r = await postJSON(srv.base, '/v1/chat/completions', body('qwen', extra));
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, param, r.text);
    assert.match(r.json.error.message, re, r.text);
  };
  await expect400({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } },
    'tool_choice', /tool_choice names 'nope', which is not in 'tools'/);
  await expect400({ tool_choice: 'required' }, 'tool_choice', /no 'tools'/);
  await expect400({ tool_choice: { type: 'function', function: { name: 'get_time' } } }, 'tool_choice', /no 'tools'/);
  await expect400({ tools: TOOLS, tool_choice: { type: 'function' } }, 'tool_choice', /must be/);
  await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {} } } },
    'response_format', /must be an object schema/);
  await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x' } } },
    'response_format', /json_schema.schema' must be an object/);
  await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string', pattern: '^x' } } } } } },
    'response_format', /'response_format.json_schema.schema.properties.a.pattern' is not supported/);
  await expect400({ response_format: { type: 'yaml' } }, 'response_format', /'yaml'/);
  await expect400({ response_format: 'json_object' }, 'response_format', /must be an object/);
  await expect400({ tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } },
    'tool_choice', /response_format/);
  // and through the SDK, as an APIError with the status
  await assert.rejects(client.chat.completions.create(body('llama', { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } })),
    (e) => e.status === 400 && /not in 'tools'/.test(e.message));
});

// Structured output on the repository's default model (models/default, a small Llama whose
// answers are noisy enough to show what the grammar lets through): response_format and
// strict tools under tool_choice "required" and "auto", as the OpenAI API enforces them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, DEFAULT } from './lib.mjs';

let srv;
// towards closing tokens, so that strings, arrays and objects end within max_tokens: the
// constraint still decides which tokens may come (a biased one that does not fit never does)
const bias = {};
before(async () => {
  srv = await startServer(['--model', DEFAULT, '--device', 'cpu', '--parallel', '4']);
  for (const [s, b] of [['"', 30], [']', 12], ['}', 12]]) {
    const t = (await postJSON(srv.base, '/tokenize', { prompt: s, add_special_tokens: false })).json.tokens;
    assert.equal(t.length, 1);
    bias[t[0]] = b;
  }
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const chat = (extra) => postJSON(srv.base, '/v1/chat/completions', {
  messages: [{ role: 'user', content: 'Tell me about the weather in Paris, as JSON.' }],
  temperature: 1, max_tokens: 300, logit_bias: bias, ...extra,
});

// Whitespace outside strings: none, one space, or a newline and an indent (llama.cpp's rule).
function checkSpacing(text) {
  const outside = text.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  for (const run of outside.match(/\s+/g) ?? [])
    assert.match(run, /^( |\n[ \t]{0,20})$/, `whitespace run ${JSON.stringify(run)} in ${text}`);
}

test('response_format json_schema and json_object: parsed, no whitespace runs', async () => {
  const schema = {
    type: 'object',
    properties: { city: { type: 'string' }, days: { type: 'integer' }, sunny: { type: 'boolean' },
                  unit: { enum: ['C', 'F'] }, temps: { type: 'array', items: { type: 'number' } } },
    required: ['city', 'days'],
  };
  const seeds = [1, 2, 3, 4]; // at once: the server runs four sequences together
  const schemaReplies = await Promise.all(seeds.map((seed) =>
    chat({ seed, response_format: { type: 'json_schema', json_schema: { name: 'w', schema } } })));
  for (const r of schemaReplies) {
    assert.equal(r.status, 200, r.text);
    const c = r.json.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v.city, 'string');
    assert.ok(Number.isInteger(v.days));
    checkSpacing(c.message.content);
  }
  const objectReplies = await Promise.all(seeds.map((seed) =>
    chat({ seed, max_tokens: 120, response_format: { type: 'json_object' } })));
  for (const r of objectReplies) {
    const c = r.json.choices[0];
    // an object ends when the model closes it; until then only its spacing is checked
    if (c.finish_reason === 'stop') JSON.parse(c.message.content);
    checkSpacing(c.message.content.replace(/"(?:[^"\\]|\\.)*$/, '""'));
  }
});

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                  required: ['city', 'days'], additionalProperties: false },
  },
};
const TIME = { type: 'function', function: { name: 'get_time', strict: true, parameters: { type: 'object', properties: {} } } };

test('tool_choice "required": a strict tool\'s arguments follow its schema', async () => {
  const seen = new Set();
  const replies = await Promise.all([1, 2, 3, 4, 5, 6].map((seed) =>
    chat({ seed, tools: [TIME, WEATHER], tool_choice: 'required' })));
  for (const r of replies) {
    assert.equal(r.status, 200, r.text);
    const c = r.json.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    const call = c.message.tool_calls[0].function;
    seen.add(call.name);
    const args = JSON.parse(call.arguments);
    if (call.name === 'get_weather') {
      assert.deepEqual(Object.keys(args), ['city', 'days'], call.arguments);
      assert.equal(typeof args.city, 'string');
      assert.ok(Number.isInteger(args.days));
    } else {
      assert.equal(call.name, 'get_time');
      assert.equal(call.arguments, '{}');
    }
  }
  assert.equal(seen.size, 2, 'the seeds call both tools');
  // the strict tool alone: every call is one of it, with its required fields
  for (const seed of [7, 8]) {
    const r = await chat({ seed, tools: [WEATHER], tool_choice: 'required' });
    const call = r.json.choices[0].message.tool_calls[0].function;
    assert.equal(call.name, 'get_weather');
    const args = JSON.parse(call.arguments);
    assert.equal(typeof args.city, 'string', call.arguments);
    assert.ok(Number.isInteger(args.days), call.arguments);
  }
});

test('tool_choice "auto" with a strict tool: free text, the schema checked up front', async () => {
  // the default model does not call tools by itself: its text stays free (not JSON)
  const r = await chat({ seed: 1, max_tokens: 24, tools: [TIME, WEATHER], tool_choice: 'auto' });
  assert.equal(r.status, 200, r.text);
  const c = r.json.choices[0];
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(c.message.content && c.message.content.length > 0);
  // a strict schema atlas cannot enforce is refused under "auto" too, naming it
  const bad = { type: 'function', function: { ...WEATHER.function, parameters: { type: 'object', properties: { city: { type: 'string', pattern: '^[A-Z]' } } } } };
  const refused = await chat({ tools: [bad], tool_choice: 'auto' });
  assert.equal(refused.status, 400, refused.text);
  assert.equal(refused.json.error.param, 'tools');
  assert.match(refused.json.error.message, /tools\[0\]\.function\.parameters\.properties\.city\.pattern/);
  const absent = await chat({ tools: [bad] }); // no tool_choice: "auto"
  assert.equal(absent.status, 400, absent.text);
});

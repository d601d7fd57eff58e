// Operators' overrides: --chat-template (a Jinja file for every model, a tokenizer_config.json
// for one model by NAME=) replaces the template that /apply-template, /tokenize and chat
// render; a template that does not parse stops the start naming its file and line; and
// --tool-call-format makes a model's tool calls be written and parsed in the format given.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, BIN, LLAMA, QWEN } from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'atlas-overrides-'));
const jinja = path.join(dir, 'plain.jinja');
writeFileSync(jinja, '{% for m in messages %}<<{{ m.role }}>>{{ m.content }}\n{% endfor %}' +
  '{% if add_generation_prompt %}<<assistant>>{% endif %}');
const config = path.join(dir, 'tokenizer_config.json');
writeFileSync(config, JSON.stringify({ chat_template: '{{ bos_token }}ONLY {{ messages[0].content }}' }));
const broken = path.join(dir, 'broken.jinja');
writeFileSync(broken, 'fine\n{% if %}\n');

let srv;
before(async () => {
  srv = await startServer(['--model', LLAMA, '--model', QWEN, '--max-resident', '2', '--device', 'cpu',
    '--chat-template', `llama=${config}`, '--chat-template', jinja, '--tool-call-format', 'llama=hermes']);
});
after(async () => {
  const r = await srv.stop();
  rmSync(dir, { recursive: true, force: true });
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }];
const tokens = async (body) => (await postJSON(srv.base, '/tokenize', body)).json.tokens;

test('a replaced template: the prompt and its tokens are the operator\'s', async () => {
  const q = await postJSON(srv.base, '/apply-template', { model: 'qwen', messages });
  assert.equal(q.status, 200, q.text);
  assert.equal(q.json.prompt, '<<system>>Be brief.\n<<user>>Hello there\n<<assistant>>');
  assert.deepEqual(await tokens({ model: 'qwen', messages }),
    await tokens({ model: 'qwen', prompt: q.json.prompt, add_special_tokens: false }));
  // NAME= wins over the one for every model, whatever the order; the model's bos_token stays
  const l = await postJSON(srv.base, '/apply-template', { model: 'llama', messages });
  assert.equal(l.json.prompt, '<|begin_of_text|>ONLY Be brief.');
  const lt = await tokens({ model: 'llama', messages });
  assert.deepEqual(lt, await tokens({ model: 'llama', prompt: l.json.prompt, add_special_tokens: false }));
  assert.equal(lt[0], 128000, 'the bos token is the special token');
  // chat renders it too: usage counts the replaced prompt
  const c = await postJSON(srv.base, '/v1/chat/completions', { model: 'qwen', messages, max_tokens: 1 });
  assert.equal(c.json.usage.prompt_tokens, (await tokens({ model: 'qwen', messages })).length);
});

test('a forced tool-call format: the call is written and parsed as that format', async () => {
  // a strict tool without parameters under "required": the reply is exactly one call
  const tools = [{ type: 'function', function: { name: 'ping', strict: true,
    parameters: { type: 'object', properties: {}, additionalProperties: false } } }];
  const r = await postJSON(srv.base, '/v1/chat/completions', { model: 'llama', messages, tools,
    tool_choice: 'required', max_tokens: 60, temperature: 0, logprobs: true });
  assert.equal(r.status, 200, r.text);
  const c = r.json.choices[0];
  assert.equal(c.finish_reason, 'tool_calls', r.text);
  assert.equal(c.message.tool_calls[0].function.name, 'ping');
  assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), {});
  // Hermes's shape, not Llama 3's, is what was generated: the tokens' texts say so
  const raw = c.logprobs.content.map((t) => t.token).join('');
  assert.equal(raw, '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>');
});

test('a template that does not parse, an unknown format or model: refused at start', async () => {
  await assert.rejects(startServer(['--model', QWEN, '--device', 'cpu', '--chat-template', broken]),
    (e) => e.message.includes('server exited (1)') && e.message.includes(`${broken}:2:7`));
  const run = (args) => spawnSync(BIN, ['serve', '--port', '0', '--model', QWEN, ...args], { encoding: 'utf8' });
  const f = run(['--tool-call-format', 'xml']);
  assert.equal(f.status, 2);
  assert.match(f.stderr, /'xml': not one of hermes, llama3, mistral, harmony, none/);
  const m = run(['--chat-template', `nosuch=${jinja}`]);
  assert.equal(m.status, 2);
  assert.match(m.stderr, /no served model is named 'nosuch'/);
  const h = spawnSync(BIN, ['serve', '--help'], { encoding: 'utf8' });
  assert.match(h.stdout, /--tool-call-format \[NAME=\]F[\s\S]*hermes, llama3, mistral, harmony or\s+none/);
});

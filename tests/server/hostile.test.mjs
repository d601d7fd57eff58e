// Malformed and hostile input: every one answered with a clear error or dropped, none
// crashes the server or stops it serving others, and the server is healthy (and exits
// cleanly, leak-free under ASan) at the end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, getJSON, rawExchange, statusOf, greedy, LLAMA, QWEN } from './lib.mjs';

let srv;
before(async () => {
  srv = await startServer(['--model', LLAMA, '--model', QWEN, '--timeout', '2', '--max-body', '1M']);
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const CHAT = '/v1/chat/completions';
const msg = [{ role: 'user', content: 'hi' }];

async function expectError(body, status, paramOrRe) {
  const r = await postJSON(srv.base, CHAT, body);
  assert.equal(r.status, status, `${String(body).slice(0, 80)} -> ${r.status} ${r.text.slice(0, 300)}`);
  assert.ok(r.json && r.json.error && typeof r.json.error.message === 'string', r.text);
  if (typeof paramOrRe === 'string') assert.equal(r.json.error.param, paramOrRe, r.text);
  else if (paramOrRe) assert.match(r.json.error.message, paramOrRe);
  return r;
}

test('bad JSON: syntax errors say where', async () => {
  const r = await expectError('{"model": "llama", "messages": [', 400, /line 1 column/);
  assert.equal(r.json.error.type, 'invalid_request_error');
  await expectError('', 400, /empty/);
  await expectError('[1, 2, 3]', 400, /object/);
  await expectError('{"model": "llama", "model": "qwen", "messages": []}', 400, /duplicate/);
  await expectError('{"a": tru}', 400, /line 1/);
});

test('wrong types and values name the field', async () => {
  await expectError({ model: 7, messages: msg }, 400, 'model');
  await expectError({ model: 'llama', messages: [{ content: 'no role' }] }, 400, 'messages');
  await expectError({ model: 'llama', messages: [{ role: 'user', content: { x: 1 } }] }, 400, 'messages');
  await expectError({ model: 'llama', messages: msg, stop: [1, 2] }, 400, 'stop');
  await expectError({ model: 'llama', messages: msg, stream: 'yes' }, 400, 'stream');
  await expectError({ model: 'llama', messages: msg, top_p: 0 }, 400, 'top_p');
  await expectError({ model: 'llama', messages: msg, logit_bias: { 5: 1000 } }, 400, 'logit_bias');
  await expectError({ model: 'llama', messages: msg, logit_bias: { 999999999: 1 } }, 400, 'logit_bias');
  await expectError({ model: 'llama', messages: msg, logit_bias: { ' 5': 1 } }, 400, 'logit_bias');
  await expectError({ model: 'llama', messages: msg, logit_bias: { '+5': 1 } }, 400, 'logit_bias');
  // limits: a long stop string costs the engine quadratic time per token
  await expectError({ model: 'llama', messages: msg, stop: ['x'.repeat(513)] }, 400, /stop\[0\].*at most 512/);
  await expectError({ model: 'llama', messages: msg, stop: 'a\u0000b' }, 400, /NUL/);
  await expectError({ model: 'llama', messages: msg, stop: Array(17).fill('s') }, 400, 'stop');
  await expectError({ model: 'llama', messages: msg,
    logit_bias: Object.fromEntries(Array.from({ length: 4097 }, (_, i) => [String(i), 1])) }, 400, 'logit_bias');
  await expectError({ model: 'llama', messages: msg, logprobs: true, top_logprobs: 1e9 }, 400, 'top_logprobs');
  await expectError({ model: 'llama', messages: msg, max_tokens: 1e300 }, 400, 'max_tokens');
  await expectError({ model: 'llama', messages: msg, tools: 'all' }, 400, 'tools');
  await expectError({ model: 'llama', messages: msg, top_logprobs: 3 }, 400, 'top_logprobs');
  await expectError({ model: 'llama', messages: msg, response_format: { type: 'json_schema' } }, 400, 'response_format');
  await expectError({ model: 'llama', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 400, 'messages');
  const img = await expectError({ model: 'llama', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }, { type: 'image_url', image_url: { url: 'x' } }] }] }, 400, /content\[1\]': "image_url" parts are not supported/);
  assert.equal(img.json.error.param, 'messages');
  const c = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: [1, -4] });
  assert.equal(c.status, 400);
  assert.equal(c.json.error.param, 'prompt');
  const c2 = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: [1, 2e9] });
  assert.equal(c2.status, 400);
  const c3 = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: ['a', [5, 'x']] });
  assert.equal(c3.status, 400);
  assert.match(c3.json.error.message, /prompt\[1\]\[1\]/);
  const c4 = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: Array(17).fill('a') });
  assert.equal(c4.status, 400);
  // several prompts stream as one: chunks of both choices, one [DONE]
  const c5 = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: ['a', 'b'], stream: true, max_tokens: 3 });
  assert.equal(c5.status, 200);
  assert.equal(c5.text.split('data: [DONE]').length, 2);
  assert.match(c5.text, /"index":0/);
  assert.match(c5.text, /"index":1/);
});

test('huge and negative numbers', async () => {
  await expectError(`{"model":"llama","messages":[{"role":"user","content":"x"}],"max_tokens":1e400}`, 400);
  await expectError(`{"model":"llama","messages":[{"role":"user","content":"x"}],"max_tokens":123456789012345678901234567890}`, 400);
  await expectError({ model: 'llama', messages: msg, max_tokens: 2 ** 40 }, 400, 'max_tokens');
  await expectError({ model: 'llama', messages: msg, max_tokens: -1 }, 400, 'max_tokens');
  await expectError({ model: 'llama', messages: msg, max_tokens: 0 }, 400, 'max_tokens');
  await expectError({ model: 'llama', messages: msg, max_tokens: 3.5 }, 400, 'max_tokens');
  await expectError({ model: 'llama', messages: msg, temperature: 1e308 }, 400, 'temperature');
  await expectError({ model: 'llama', messages: msg, temperature: -1 }, 400, 'temperature');
  await expectError({ model: 'llama', messages: msg, seed: 1.5 }, 400, 'seed');
  await expectError({ model: 'llama', messages: msg, top_k: -7 }, 400, 'top_k');
});

test('invalid UTF-8, lone surrogates and NUL bytes', async () => {
  const bad = Buffer.concat([Buffer.from('{"model":"llama","messages":[{"role":"user","content":"'),
    Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]);
  await expectError(new Uint8Array(bad), 400);
  await expectError('{"model":"llama","messages":[{"role":"user","content":"\\ud800"}]}', 400);
  await expectError('{"model":"llama","messages":[{"role":"user","content":"a\\u0000b"}]}', 400);
  // an unknown model whose name is not UTF-8 in the URL: still a valid JSON error
  const r = await rawExchange(srv.port, [Buffer.from('POST /v1/models/\xff\xfe/load HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n', 'latin1')]);
  assert.equal(statusOf(r.data), 404, r.data);
  JSON.parse(r.data.slice(r.data.indexOf('\r\n\r\n') + 4).replace(/^[0-9a-f]+\r\n|\r\n0\r\n\r\n$/g, ''));
});

test('deep nesting', async () => {
  await expectError('['.repeat(100000) + ']'.repeat(100000), 400);
  const deepMsg = '{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"x","extra":' + '['.repeat(1500) + ']'.repeat(1500) + '}]}';
  const r = await postJSON(srv.base, CHAT, deepMsg);
  assert.ok([200, 400].includes(r.status), r.text.slice(0, 200));
});

test('bodies over the limit: 413 (declared length and chunked)', async () => {
  const big = 'x'.repeat(10 * 1024 * 1024);
  const r = await postJSON(srv.base, CHAT, JSON.stringify({ model: 'llama', messages: [{ role: 'user', content: big }] }));
  assert.equal(r.status, 413, r.text.slice(0, 200));
  assert.equal(r.json.error.code, 'request_too_large');
  // chunked, no Content-Length: read and discarded, then 413
  const head = 'POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n';
  const chunk = 'x'.repeat(256 * 1024);
  const parts = [head];
  for (let i = 0; i < 8; i++) parts.push(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
  parts.push('0\r\n\r\n');
  const raw = await rawExchange(srv.port, parts, { timeoutMs: 10000 });
  assert.equal(statusOf(raw.data), 413, raw.data.slice(0, 200));
  // a huge header is refused by the HTTP layer
  const hdr = await rawExchange(srv.port, [`GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: ${'y'.repeat(200000)}\r\n\r\n`]);
  assert.ok(hdr.closed || statusOf(hdr.data) >= 400, hdr.data.slice(0, 100));
});

test('slowloris: partial requests are dropped after the timeout, others still served', async () => {
  const t0 = Date.now();
  const partial = [];
  for (let i = 0; i < 40; i++)
    partial.push(rawExchange(srv.port, ['POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le'], { timeoutMs: 15000 }));
  partial.push(rawExchange(srv.port, ['POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{"model"'], { timeoutMs: 15000 }));
  // meanwhile a real request goes through
  const ok = await postJSON(srv.base, '/v1/completions', { model: 'llama', prompt: 'hi', max_tokens: 2 });
  assert.equal(ok.status, 200, ok.text);
  const results = await Promise.all(partial);
  for (const r of results) {
    assert.ok(r.closed, 'the server closed the unfinished request');
    assert.ok(r.ms < 10000, `closed after ${r.ms} ms`);
  }
  assert.ok(Date.now() - t0 >= 1500, 'not before the timeout');
});

test('a client that disconnects mid-stream cancels its request at once', async () => {
  const before = await getJSON(srv.base, '/metrics');
  const cancelledBefore = Number(before.text.match(/atlas_requests_finished_total\{reason="cancelled"\} (\d+)/)[1]);
  const ac = new AbortController();
  const res = await fetch(srv.base + CHAT, {
    method: 'POST', headers: { 'content-type': 'application/json' }, signal: ac.signal,
    body: JSON.stringify(greedy('llama', 'go on', { max_tokens: 100000, ignore_eos: true, stream: true })),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  let got = 0;
  while (got < 3) { const { value } = await reader.read(); got += (new TextDecoder().decode(value).match(/data: /g) || []).length; }
  ac.abort();
  let cancelled = cancelledBefore, running = 1;
  for (let i = 0; i < 50 && (cancelled === cancelledBefore || running > 0); i++) {
    await new Promise((r) => setTimeout(r, 100));
    const m = (await getJSON(srv.base, '/metrics')).text;
    cancelled = Number(m.match(/atlas_requests_finished_total\{reason="cancelled"\} (\d+)/)[1]);
    running = Number(m.match(/atlas_running_sequences (\d+)/)[1]);
  }
  assert.equal(cancelled, cancelledBefore + 1, 'the engine request was cancelled');
  assert.equal(running, 0, 'its sequence is gone');
  // a raw client that sends a request and closes before the answer
  for (let i = 0; i < 10; i++)
    await rawExchange(srv.port, [`POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${JSON.stringify(greedy('qwen', 'x', { max_tokens: 500, ignore_eos: true })).length}\r\n\r\n${JSON.stringify(greedy('qwen', 'x', { max_tokens: 500, ignore_eos: true }))}`], { timeoutMs: 30 });
});

test('unknown routes, methods, and the server still healthy after all of it', async () => {
  assert.equal((await getJSON(srv.base, '/nope')).status, 404);
  assert.equal((await postJSON(srv.base, '/health', {})).status, 405);
  const raw = await rawExchange(srv.port, ['GARBAGE\r\n\r\n']);
  assert.ok(raw.closed);
  const h = await getJSON(srv.base, '/health');
  assert.equal(h.status, 200);
  const r = await srv.client().chat.completions.create(greedy('qwen', 'still there?', { max_tokens: 3 }));
  assert.equal(r.usage.completion_tokens, 3);
});

// What atlas says on stderr: the start banner of `atlas serve` (models, device, memory, KV
// capacity, URL), one access-log line per request in text and in JSON (--log-format), the
// levels (--log-level), that no API key, Authorization header or prompt text reaches the
// log, and the one line `atlas run` prints for a load when stderr is not a terminal.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, postJSON, getJSON, waitFor, BIN, DATA } from './lib.mjs';

const KEY = 'sk-log-test-9f3c1a77e2';
const PROMPT = 'zanzibar-quokka-prompt-4471';
const auth = { authorization: `Bearer ${KEY}` };

// One text access line: time level METHOD PATH model= status= tokens_in= tokens_out= ttft_ms= total_ms= client=
const TEXT_LINE = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) (info|warn|error) (GET|POST|OPTIONS) (\S+) model=(\S+) status=(\d{3}) tokens_in=(\d+) tokens_out=(\d+) ttft_ms=(\d+\.\d|-) total_ms=(\d+\.\d) client=(\S+)$/;

function accessLines(log) {
  return log.split('\n').filter((l) => / status=\d{3} /.test(l)).map((l) => {
    const m = l.match(TEXT_LINE);
    assert.ok(m, `access line of the wrong shape: ${JSON.stringify(l)}`);
    return { time: m[1], level: m[2], method: m[3], path: m[4], model: m[5], status: Number(m[6]),
      tokensIn: Number(m[7]), tokensOut: Number(m[8]), ttft: m[9], total: Number(m[10]), client: m[11] };
  });
}

// A streamed chat: the SSE body read to its end.
async function stream(base, content) {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...auth },
    body: JSON.stringify({ model: 'default', messages: [{ role: 'user', content }], max_tokens: 6, temperature: 0, stream: true }),
  });
  assert.equal(res.status, 200);
  const text = await res.text();
  assert.match(text, /data: \[DONE\]/);
}

// The same five requests against either format: a whole answer, a stream, a model not
// served (404), a body that is not JSON (400), and the model list.
async function requests(srv) {
  const chat = await postJSON(srv.base, '/v1/chat/completions',
    { model: 'default', messages: [{ role: 'user', content: PROMPT }], max_tokens: 6, temperature: 0 }, auth);
  assert.equal(chat.status, 200, chat.text);
  await stream(srv.base, `${PROMPT} streamed`);
  const missing = await postJSON(srv.base, '/v1/chat/completions',
    { model: 'no-such-model', messages: [{ role: 'user', content: PROMPT }] }, auth);
  assert.equal(missing.status, 404, missing.text);
  const bad = await postJSON(srv.base, '/v1/chat/completions', `{"model": "default", "messages": [${PROMPT}`, auth);
  assert.equal(bad.status, 400, bad.text);
  const models = await getJSON(srv.base, '/v1/models', auth);
  assert.equal(models.status, 200);
  return chat.json.choices[0].message.content;
}

function noSecrets(log, answer) {
  assert.ok(!log.includes(KEY), 'the API key is in the log');
  assert.ok(!/bearer/i.test(log), 'an Authorization header is in the log');
  assert.ok(!log.includes(PROMPT), 'the prompt text is in the log');
  if (answer.length >= 12) assert.ok(!log.includes(answer), 'the answer text is in the log');
}

test('text log: the start banner, one line per request, no secrets', async () => {
  const srv = await startServer(['--api-key', KEY]);
  try {
    const banner = srv.log();
    assert.match(banner, /^atlas: loaded default: \d+\.\d (MB|GB) in \d+\.\d+ s \(\d+\.\d GB\/s\), (cpu|cuda:\d+)$/m);
    const model = banner.match(/ info model default: dir (\S+), (\w+ForCausalLM), (\d+\.\d+[MB]) parameters, (BF16|F16|F32|mixed), device (cpu|cuda:\d+), memory (\d+\.\d+) GiB \(weights (\d+\.\d+), kv (\d+\.\d+)\), kv (\d+) tokens of (f32|bf16|fp8), context (\d+) tokens/);
    assert.ok(model, `no model line in the banner:\n${banner}`);
    assert.equal(model[2], 'LlamaForCausalLM');
    assert.ok(Number(model[9]) > 0 && Number(model[11]) > 0, model[0]);
    assert.ok(Math.abs(Number(model[6]) - Number(model[7]) - Number(model[8])) < 0.02, model[0]);
    assert.match(banner, / info device (cpu|cuda:\d+); memory used \d+\.\d+ GiB by 1 loaded model\(s\) of 1(, budget \d+\.\d+ GiB)?$/m);
    assert.match(banner, new RegExp(` info listening on http://127\\.0\\.0\\.1:${srv.port} \\(API key required\\)$`, 'm'));

    const answer = await requests(srv);
    const lines = await waitFor(() => { const l = accessLines(srv.log()); return l.length >= 5 && l; });
    assert.equal(lines.length, 5, srv.log());
    // A line is written when its response is done, so a stream's may come after the next
    // request's: each is found by what it logged, not by its place.
    const one = (what, pred) => { const m = lines.filter(pred); assert.equal(m.length, 1, `${what}: ${JSON.stringify(lines)}`); return m[0]; };
    const chats = lines.filter((l) => l.path === '/v1/chat/completions' && l.status === 200).sort((a, b) => a.tokensIn - b.tokensIn);
    assert.equal(chats.length, 2, JSON.stringify(lines));
    const [whole, streamed] = chats; // the streamed prompt is the longer
    const missing = one('the 404', (l) => l.status === 404);
    const bad = one('the 400', (l) => l.status === 400);
    const list = one('the model list', (l) => l.method === 'GET');
    for (const l of lines) {
      assert.equal(l.client, '127.0.0.1');
      assert.ok(Math.abs(Date.parse(l.time) - Date.now()) < 60000, l.time);
      assert.ok(l.total >= 0 && l.total < 60000);
    }
    assert.deepEqual([whole.method, whole.path, whole.model, whole.status, whole.level], ['POST', '/v1/chat/completions', 'default', 200, 'info']);
    assert.ok(whole.tokensIn > 0 && whole.tokensOut > 0 && whole.tokensOut <= 6, JSON.stringify(whole));
    assert.ok(whole.ttft !== '-' && Number(whole.ttft) <= whole.total, JSON.stringify(whole));
    assert.deepEqual([streamed.model, streamed.status], ['default', 200]);
    assert.ok(streamed.tokensIn > whole.tokensIn && streamed.tokensOut > 0 && streamed.ttft !== '-', JSON.stringify(streamed));
    assert.deepEqual([missing.model, missing.status, missing.level, missing.tokensOut, missing.ttft], ['no-such-model', 404, 'warn', 0, '-']);
    assert.deepEqual([bad.model, bad.status, bad.level], ['-', 400, 'warn']);
    assert.deepEqual([list.method, list.path, list.status], ['GET', '/v1/models', 200]);
    noSecrets(srv.log(), answer);
  } finally {
    const r = await srv.stop();
    assert.equal(r.code, 0, srv.log());
  }
});

test('a stream the client leaves: its line counts the prompt and the tokens sent', async () => {
  const srv = await startServer([]);
  try {
    const messages = [{ role: 'user', content: 'Tell me a long story' }];
    const whole = await postJSON(srv.base, '/v1/chat/completions', { model: 'default', messages, max_tokens: 1 });
    assert.equal(whole.status, 200, whole.text);
    const ctl = new AbortController();
    const res = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: ctl.signal,
      body: JSON.stringify({ model: 'default', messages, max_tokens: 200, ignore_eos: true, stream: true }),
    });
    assert.equal(res.status, 200, await (res.status === 200 ? '' : res.text()));
    const reader = res.body.getReader();
    let got = '';
    while ((got.match(/"content":"[^"]/g) || []).length < 3) got += new TextDecoder().decode((await reader.read()).value);
    ctl.abort();
    // the second chat line: the whole answer's has tokens_out 1
    const line = await waitFor(() => accessLines(srv.log()).find((l) => l.path === '/v1/chat/completions' && l.tokensOut !== 1));
    assert.equal(line.status, 200, srv.log());
    assert.equal(line.tokensIn, whole.json.usage.prompt_tokens, JSON.stringify(line));
    assert.ok(line.tokensOut >= 3 && line.tokensOut < 200, JSON.stringify(line));
  } finally {
    await srv.stop();
  }
});

test('JSON log: every line an object, requests with typed fields; --log-level warn', async () => {
  const srv = await startServer(['--api-key', KEY, '--log-format', 'json']);
  let log;
  try {
    const answer = await requests(srv);
    await waitFor(() => (srv.log().match(/"status":/g) || []).length >= 5);
    log = srv.log();
    noSecrets(log, answer);
  } finally {
    const r = await srv.stop();
    assert.equal(r.code, 0, srv.log());
  }
  const objs = srv.log().split('\n').filter((l) => l.length).map((l) => {
    try { return JSON.parse(l); } catch { assert.fail(`not a JSON line: ${JSON.stringify(l)}`); }
  });
  for (const o of objs) {
    assert.match(o.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(['error', 'warn', 'info', 'debug'].includes(o.level), JSON.stringify(o));
  }
  assert.ok(objs.some((o) => /^loaded default: /.test(o.msg)), log);
  assert.ok(objs.some((o) => /^model default: dir \S+, LlamaForCausalLM, /.test(o.msg)), log);
  assert.ok(objs.some((o) => o.msg === `listening on http://127.0.0.1:${srv.port} (API key required)`), log);
  const reqs = objs.filter((o) => 'status' in o);
  assert.equal(reqs.length, 5, log);
  for (const o of reqs) {
    assert.deepEqual(Object.keys(o), ['time', 'level', 'method', 'path', 'model', 'status', 'tokens_in', 'tokens_out', 'ttft_ms', 'total_ms', 'client']);
    assert.ok(Number.isInteger(o.status) && Number.isInteger(o.tokens_in) && Number.isInteger(o.tokens_out));
    assert.equal(typeof o.total_ms, 'number');
    assert.ok(o.ttft_ms === null || typeof o.ttft_ms === 'number');
    assert.equal(o.client, '127.0.0.1');
  }
  const by = (s) => reqs.filter((o) => o.status === s);
  assert.equal(by(200).length, 3);
  assert.ok(by(200).filter((o) => o.path === '/v1/chat/completions').every((o) => o.model === 'default' && o.tokens_out > 0 && o.ttft_ms > 0));
  assert.deepEqual([by(404)[0].model, by(404)[0].level, by(404)[0].ttft_ms], ['no-such-model', 'warn', null]);
  assert.deepEqual([by(400)[0].model, by(400)[0].level], [null, 'warn']);

  // warn: the failures only
  const quiet = await startServer(['--log-level', 'warn']);
  try {
    assert.equal((await getJSON(quiet.base, '/v1/models')).status, 200);
    assert.equal((await getJSON(quiet.base, '/v1/nothing-here')).status, 404);
    await waitFor(() => / status=404 /.test(quiet.log()));
    const lines = accessLines(quiet.log());
    assert.deepEqual(lines.map((l) => [l.path, l.status, l.level]), [['/v1/nothing-here', 404, 'warn']]);
  } finally {
    await quiet.stop();
  }
});

test('bad --log-format and --log-level values are usage errors', () => {
  for (const args of [['--log-format', 'xml'], ['--log-level', 'loud']]) {
    const r = spawnSync(BIN, ['serve', '--port', '0', ...args], { encoding: 'utf8', timeout: 10000 });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`${args[0]}: '${args[1]}'`));
  }
});

test('atlas run, stderr not a terminal: one line for the load, no bar', () => {
  const r = spawnSync(BIN, ['run', '-n', '2', '-p', 'hello'], { encoding: 'utf8', timeout: 30000 });
  assert.equal(r.status, 0, r.stderr);
  const loads = r.stderr.split('\n').filter((l) => l.startsWith('atlas: load'));
  assert.equal(loads.length, 1, r.stderr);
  assert.match(loads[0], /^atlas: loaded default: \d+\.\d (MB|GB) in \d+\.\d+ s \(\d+\.\d GB\/s\), (cpu|cuda:\d+)$/);
  assert.ok(!r.stderr.includes('\r') && !r.stderr.includes('\x1b['), JSON.stringify(r.stderr));
});

test('atlas run on a directory whose name is not UTF-8: the load line is UTF-8', () => {
  const root = mkdtempSync(join(tmpdir(), 'atlas-run-name-'));
  try {
    symlinkSync(join(DATA, 'tiny-qwen3'), Buffer.concat([Buffer.from(`${root}/caf\u00e9`), Buffer.from([0xff])]));
    // argv carries bytes that are not UTF-8 only through a shell
    const r = spawnSync('sh', ['-c', `exec "$ATLAS_BIN" run --device cpu -n 1 -p hi -m "${root}/$(printf 'caf\\303\\251\\377')"`],
                        { timeout: 30000 });
    const stderr = new TextDecoder('utf-8', { fatal: true }).decode(r.stderr);
    assert.equal(r.status, 0, stderr);
    assert.match(stderr, /^atlas: loaded caf\u00e9\ufffd: \d+\.\d (MB|GB) in /m);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

// Requests whose path or model hold bytes that are not UTF-8, or are cut inside a character
// (the path is kept to 255 bytes, the model to 127): each must still leave its one line.
// The expected path and model are what the line says, null for no model.
const A126 = 'a'.repeat(126);
async function oddRequests(base) {
  const wrong = { authorization: 'Bearer sk-not-the-key' };
  const cases = [
    // a failed key on a model id of 126 bytes and a euro sign: the model's cut falls in it
    [`/v1/models/${A126}%E2%82%AC`, 'GET', wrong, null, 401, `/v1/models/${A126}\u20ac`, A126],
    [`/v1/models`, 'GET', {}, null, 401, '/v1/models', null], // no key at all
    [`/v1/models%FF`, 'GET', auth, null, 404, '/v1/models\ufffd', null],
    // a path of 254 bytes and a euro sign: its cut falls in the euro sign
    [`/v1/models/${'a'.repeat(243)}%E2%82%AC`, 'GET', auth, null, 404, `/v1/models/${'a'.repeat(243)}`, 'a'.repeat(127)],
    [`/v1/models/a%0Ab%22c`, 'GET', auth, null, 404, '/v1/models/a\nb"c', 'a\nb"c'],
    ['/v1/chat/completions', 'POST', auth, JSON.stringify({ model: `${A126}\u20ac`, messages: [{ role: 'user', content: 'hi' }] }),
      404, '/v1/chat/completions', A126],
    ['/v1/chat/completions', 'POST', auth, Buffer.from([...Buffer.from('{"model": "'), 0xff, ...Buffer.from('"}')]),
      400, '/v1/chat/completions', null],
  ];
  for (const [route, method, headers, body, status] of cases) {
    const res = await fetch(base + route, { method, headers: { 'content-type': 'application/json', ...headers }, body });
    await res.text();
    assert.equal(res.status, status, `${method} ${route}`);
  }
  return cases.map(([, method, , , status, path, model]) => ({ method, status, path, model }));
}

// The log's bytes as they came (not decoded chunk by chunk): they must be UTF-8.
function rawStderr(srv) {
  const chunks = [];
  srv.child.stderr.on('data', (d) => chunks.push(d));
  return () => new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(chunks));
}

// A text-format value as written: plain, or quoted with \" \\ and \xNN escapes.
function textValue(v) {
  if (!v.startsWith('"')) return v;
  assert.ok(v.endsWith('"') && v.length >= 2, v);
  return v.slice(1, -1).replace(/\\(x[0-9a-f]{2}|["\\])/g, (m, e) => (e.length === 3 ? String.fromCharCode(parseInt(e.slice(1), 16)) : e));
}

test('odd bytes in the path or the model: one line each, JSON and text', async () => {
  for (const format of ['json', 'text']) {
    const srv = await startServer(['--api-key', KEY, '--log-format', format, '--log-level', format === 'json' ? 'debug' : 'info']);
    const log = rawStderr(srv);
    let want;
    try {
      want = await oddRequests(srv.base);
      await waitFor(() => (log().match(/status[=":]+\d{3}/g) || []).length >= want.length);
    } finally {
      assert.equal((await srv.stop()).code, 0, srv.log());
    }
    const text = log();
    let got, starts = [];
    if (format === 'json') {
      const objs = text.split('\n').filter((l) => l.length).map((l) => {
        try { return JSON.parse(l); } catch { assert.fail(`not a JSON line: ${JSON.stringify(l)}`); }
      });
      got = objs.filter((o) => 'status' in o).map((o) => ({ method: o.method, status: o.status, path: o.path, model: o.model }));
      starts = objs.filter((o) => o.event === 'request').map((o) => o.path);
      assert.deepEqual(starts.sort(), want.map((w) => w.path).sort(), 'one debug line as each request arrives');
    } else {
      got = accessLines(text).map((l) => ({ method: l.method, status: l.status, path: textValue(l.path),
        model: l.model === '-' ? null : textValue(l.model) }));
    }
    const key = (r) => JSON.stringify([r.method, r.status, r.path, r.model]);
    assert.deepEqual(got.map(key).sort(), want.map(key).sort(), `${format}:\n${text}`);
  }
});

// What `atlas serve` tells the operator: each model checked at start (ok with its size, or
// why it cannot load), every load, release, swap, drain and failed load with its model,
// time and reason, a 5xx's reason in its access line, and a warning for a non-loopback
// bind without an API key; in text and in JSON.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, waitFor, DATA, DEFAULT, LLAMA, QWEN } from './lib.mjs';
import { sparseCheckpoint } from './sparse.mjs';

const big = sparseCheckpoint();
// a model directory with a config and a tokenizer but no weights
const empty = mkdtempSync(path.join(os.tmpdir(), 'atlas-noweights-'));
for (const f of ['config.json', 'tokenizer.json']) copyFileSync(path.join(DATA, 'tiny-llama3', f), path.join(empty, f));
after(() => {
  rmSync(big.dir, { recursive: true, force: true });
  rmSync(empty, { recursive: true, force: true });
});

const lines = (log, re) => log.split('\n').filter((l) => re.test(l));
const T = '^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z';

test('start: every model checked and reported; a failed load logged with why, in its access line too', async () => {
  const srv = await startServer(['--model', DEFAULT, '--model', `big=${big.dir}`, '--model', `empty=${empty}`, '--device', 'cpu']);
  try {
    const start = srv.log();
    assert.match(start, new RegExp(`${T} info model default: ok: LlamaForCausalLM, 7\\.0M parameters, BF16, 0\\.01 GiB of weights$`, 'm'));
    assert.match(start, new RegExp(`${T} error model big: cannot load: it needs \\d+\\.\\d\\d GiB \\(weights \\d+\\.\\d\\d, KV cache \\d+\\.\\d\\d\\) and \\d+\\.\\d\\d GiB is available \\(.+\\); lower --kv-memory or --ctx-size, or pass --no-memory-check$`, 'm'));
    assert.match(start, new RegExp(`${T} error model empty: cannot load: .*model\\.safetensors`, 'm'));
    // each check comes before the start's load and the line that says where it listens
    const at = (re) => start.search(re);
    assert.ok(at(/model empty: cannot load/) < at(/atlas: loaded default/) && at(/atlas: loaded default/) < at(/listening on/), start);

    for (const model of ['big', 'empty']) {
      const r = await postJSON(srv.base, '/v1/completions', { model, prompt: 'hi', max_tokens: 2 });
      assert.equal(r.status, 503, r.text);
      const why = r.json.error.message;
      await waitFor(() => new RegExp(`model=${model} status=503`).test(srv.log()));
      const failed = lines(srv.log(), new RegExp(` error model ${model}: load failed after \\d+\\.\\d\\d s: `));
      assert.equal(failed.length, 1, srv.log());
      assert.ok(failed[0].endsWith(why), `${failed[0]}\n${why}`);
      const access = lines(srv.log(), new RegExp(`POST /v1/completions model=${model} status=503 `));
      assert.equal(access.length, 1, srv.log());
      assert.ok(access[0].endsWith(` reason=${JSON.stringify(why)}`), `${access[0]}\n${why}`);
      assert.ok(srv.log().indexOf(failed[0]) < srv.log().indexOf(access[0]), 'the load failure is logged before the request');
    }
    assert.match(lines(srv.log(), /model=big status=503/)[0], /not enough memory: .* need \d+\.\d\d GiB .* \d+\.\d\d GiB is available with the resident models released/);
    // the resident model kept its place: nothing was evicted for a model that cannot load
    assert.equal(lines(srv.log(), /model default: released/).length, 0, srv.log());
    const ok = await postJSON(srv.base, '/v1/completions', { model: 'default', prompt: 'hi', max_tokens: 2 });
    assert.equal(ok.status, 200);
    await waitFor(() => /model=default status=200/.test(srv.log()));
    assert.doesNotMatch(lines(srv.log(), /model=default status=200/)[0], /reason=/);
  } finally {
    const r = await srv.stop();
    assert.equal(r.code, 0, srv.log());
  }
});

test('swaps, loads, unloads and drains are logged with model, time and reason', async () => {
  const srv = await startServer(['--model', LLAMA, '--model', QWEN, '--max-resident', '1', '--parallel', '4']);
  try {
    const ask = (model, extra = {}) => postJSON(srv.base, '/v1/completions', { model, prompt: 'swap', max_tokens: 2, temperature: 0, ...extra });
    assert.equal((await ask('llama')).status, 200);
    assert.equal((await ask('qwen')).status, 200);
    await waitFor(() => /model qwen: loaded/.test(srv.log()));
    let log = srv.log();
    const rel = lines(log, /model llama: released/);
    assert.equal(rel.length, 1, log);
    assert.match(rel[0], new RegExp(`${T} info model llama: released in \\d+\\.\\d\\d s \\(\\d+\\.\\d\\d GiB\\), to make room for qwen$`));
    const load = lines(log, /model qwen: loaded/);
    assert.match(load[0], new RegExp(`${T} info model qwen: loaded in (\\d+\\.\\d\\d) s \\(\\d+\\.\\d\\d GiB of weights and KV cache\\) from (?:the page cache|disk), for a request; swapped in for llama in (\\d+\\.\\d\\d) s \\(release and load\\)$`));
    const [, loadS, swapS] = load[0].match(/loaded in (\S+) s.* in (\S+) s/);
    assert.ok(Number(swapS) >= Number(loadS), load[0]);
    assert.ok(log.indexOf(rel[0]) < log.indexOf(load[0]));

    // by hand: unload, then load
    assert.equal((await postJSON(srv.base, '/v1/models/qwen/unload', {})).status, 200);
    assert.equal((await postJSON(srv.base, '/v1/models/llama/load', {})).status, 200);
    log = srv.log();
    assert.match(log, new RegExp(`${T} info model qwen: released in \\d+\\.\\d\\d s \\(\\d+\\.\\d\\d GiB\\), asked to unload$`, 'm'));
    assert.match(log, new RegExp(`${T} info model llama: loaded in \\d+\\.\\d\\d s \\(\\d+\\.\\d\\d GiB of weights and KV cache\\) from (?:the page cache|disk), asked to load$`, 'm'));

    // /metrics says where each load read its weights from: the CPU keeps no host tier
    const metrics = await (await fetch(`${srv.base}/metrics`)).text();
    const num = (re) => Number((metrics.match(re) || [, 'NaN'])[1]);
    const bySource = ['host', 'page_cache', 'disk'].map((s) => num(new RegExp(`^atlas_model_loads_by_source_total\\{source="${s}"\\} (\\d+)$`, 'm')));
    assert.equal(bySource[0], 0, metrics);
    assert.equal(bySource[1] + bySource[2], num(/^atlas_model_loads_total (\d+)$/m), metrics);
    assert.ok(num(/^atlas_model_load_bytes_total\{source="page_cache"\} (\d+)$/m) + num(/^atlas_model_load_bytes_total\{source="disk"\} (\d+)$/m) > 0, metrics);

    // a swap that waits for a running request: the drain is said, then the release
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'llama', prompt: 'drain', max_tokens: 1000, ignore_eos: true, stream: true }),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read(); // the stream runs
    const other = ask('qwen');
    await waitFor(() => / model llama: draining/.test(srv.log()));
    while (!(await reader.read()).done) { /* to its end */ }
    assert.equal((await other).status, 200);
    await waitFor(() => lines(srv.log(), /model qwen: loaded/).length === 2);
    log = srv.log();
    const drain = lines(log, / model llama: draining/);
    assert.equal(drain.length, 1, log);
    assert.match(drain[0], new RegExp(`${T} info model llama: draining, 1 request\\(s\\) still running, to make room for qwen$`));
    const rel2 = lines(log, /model llama: released/)[1];
    assert.ok(rel2 && log.indexOf(drain[0]) < log.indexOf(rel2), log);
  } finally {
    const r = await srv.stop();
    assert.equal(r.code, 0, srv.log());
  }
});

test('a load beside a model that streams: its line says the other kept serving', async () => {
  // llama and qwen load at start; default then takes idle qwen's place while llama streams
  const srv = await startServer(['--model', LLAMA, '--model', QWEN, '--model', DEFAULT, '--max-resident', '2', '--parallel', '4']);
  try {
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'llama', prompt: 'stream', max_tokens: 2000, ignore_eos: true, stream: true }),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read(); // the stream runs
    const r = await postJSON(srv.base, '/v1/completions', { model: 'default', prompt: 'beside', max_tokens: 2, temperature: 0 });
    assert.equal(r.status, 200);
    const load = lines(srv.log(), /model default: loaded/);
    assert.match(load[0], new RegExp(`${T} info model default: loaded in \\d+\\.\\d\\d s \\(\\d+\\.\\d\\d GiB of weights and KV cache\\) from (?:the page cache|disk), for a request; swapped in for qwen in \\d+\\.\\d\\d s \\(release and load\\); beside 1 resident model that kept serving$`), srv.log());
    await reader.cancel();
  } finally {
    await srv.stop();
  }
});

test('a non-loopback bind without an API key is warned about; with a key, or on loopback, not', async () => {
  const WARN = /warn 0\.0\.0\.0 is not a loopback address and no API key is set: anyone who can reach it can use the models/;
  for (const args of [['--host', '0.0.0.0'], ['--host', '0.0.0.0', '--api-key', '']]) {
    const open = await startServer(args); // an empty key is none
    try {
      const log = open.log();
      assert.match(log, new RegExp(`${T} ${WARN.source}`, 'm'));
      assert.ok(log.search(WARN) < log.search(/listening on http:\/\/0\.0\.0\.0:\d+$/m), log);
      assert.equal((await fetch(`${open.base}/v1/models`)).status, 200);
    } finally {
      await open.stop();
    }
  }
  for (const args of [['--host', '0.0.0.0', '--api-key', 'sk-operator-test'], []]) {
    const srv = await startServer(args);
    try {
      assert.doesNotMatch(srv.log(), /not a loopback address/);
    } finally {
      await srv.stop();
    }
  }
});

test('JSON log: the checks and residency events as objects with their fields', async () => {
  const srv = await startServer(['--model', LLAMA, '--model', QWEN, '--model', `empty=${empty}`, '--max-resident', '1', '--log-format', 'json']);
  try {
    assert.equal((await postJSON(srv.base, '/v1/completions', { model: 'qwen', prompt: 'hi', max_tokens: 2 })).status, 200);
    assert.equal((await postJSON(srv.base, '/v1/completions', { model: 'empty', prompt: 'hi', max_tokens: 2 })).status, 503);
    await waitFor(() => /"status":503/.test(srv.log()));
  } finally {
    await srv.stop();
  }
  const objs = srv.log().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
  const ev = (e, model) => objs.filter((o) => o.event === e && o.model === model);
  assert.ok(objs.some((o) => o.level === 'info' && /^model llama: ok: LlamaForCausalLM, /.test(o.msg)), srv.log());
  assert.ok(objs.some((o) => o.level === 'error' && /^model empty: cannot load: /.test(o.msg)), srv.log());
  const [rel] = ev('model_released', 'llama');
  assert.deepEqual([rel.level, rel.reason, rel.for], ['info', 'swap', 'qwen'], JSON.stringify(rel));
  assert.ok(rel.duration_ms >= 0 && rel.bytes > 0, JSON.stringify(rel));
  const [load] = ev('model_loaded', 'qwen');
  assert.deepEqual([load.reason, load.for], ['request', 'llama'], JSON.stringify(load));
  assert.ok(load.duration_ms > 0 && load.swap_ms >= load.duration_ms && load.bytes > 0, JSON.stringify(load));
  assert.match(load.msg, /^model qwen: loaded in /);
  // each step of the load, ms after it began, ending with the load
  const steps = load.steps_ms;
  assert.ok(steps && ['config', 'files', 'backend', 'weights', 'kv', 'end'].every((k) => steps[k] >= 0), JSON.stringify(load));
  assert.ok(Object.values(steps).every((v) => v <= steps.end) && steps.end <= load.duration_ms + 1, JSON.stringify(load));
  const [failed] = ev('model_load_failed', 'empty');
  assert.equal(failed.level, 'error');
  assert.match(failed.reason, /^loading model 'empty': .*model\.safetensors/);
  const access = objs.find((o) => o.status === 503);
  assert.equal(access.reason, failed.reason);
  assert.deepEqual(Object.keys(access), ['time', 'level', 'method', 'path', 'model', 'status', 'tokens_in', 'tokens_out', 'ttft_ms', 'total_ms', 'client', 'reason']);
  // the empty model's failure cost qwen nothing: checked before any eviction
  assert.equal(ev('model_released', 'qwen').length, 0, srv.log());
});

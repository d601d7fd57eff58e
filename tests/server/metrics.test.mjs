// /metrics in the Prometheus text exposition format (version 0.0.4), read by a strict parser:
// every line must parse (HELP and TYPE included), so one model whose name holds a quote or a
// backslash cannot spoil the scrape of the whole page; names that break the rule of model
// names (a newline, bytes that are not UTF-8) are skipped at start, never served half-listed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, symlinkSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, getJSON, DATA } from './lib.mjs';

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);
// Go's strconv.ParseFloat as Prometheus reads a value: a decimal or hex float, or Inf/NaN.
const FLOAT = /^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0[xX][0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?\d+)?|[Ii]nf(?:inity)?|NaN)$/;

// A HELP docstring may escape only a backslash and a newline.
function unescapeHelp(s, where) {
  return s.replace(/\\(.?)/g, (m, c) => {
    if (c === '\\') return '\\';
    if (c === 'n') return '\n';
    throw new Error(`${where}: bad escape ${JSON.stringify(m)} in a HELP text`);
  });
}

// `{name="value",...}` from s[i] (which is '{'): returns [labels, index after '}'].
function parseLabels(s, i, where) {
  const labels = {};
  i++;
  for (;;) {
    if (s[i] === '}') return [labels, i + 1];
    const m = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(s.slice(i));
    if (!m) throw new Error(`${where}: bad label name at ${i}`);
    const name = m[0];
    i += name.length;
    if (s[i] !== '=' || s[i + 1] !== '"') throw new Error(`${where}: expected =" after ${name}`);
    i += 2;
    let v = '';
    for (;;) {
      const c = s[i];
      if (c === undefined) throw new Error(`${where}: unterminated value of ${name}`);
      if (c === '"') break;
      if (c === '\n') throw new Error(`${where}: raw newline in ${name}`);
      if (c === '\\') {
        const e = s[i + 1];
        if (e === '\\' || e === '"') v += e;
        else if (e === 'n') v += '\n';
        else throw new Error(`${where}: bad escape \\${e} in ${name}`);
        i += 2;
      } else {
        v += c;
        i++;
      }
    }
    i++;
    if (name in labels) throw new Error(`${where}: label ${name} twice`);
    labels[name] = v;
    if (s[i] === ',') i++;
    else if (s[i] !== '}') throw new Error(`${where}: expected , or } after ${name}`);
  }
}

// The whole page: bytes that must be UTF-8, lines that must each parse; families declared
// (HELP/TYPE once each, before their samples), samples of one family together, no series
// twice, histograms with their le label and _sum/_count.  Returns the samples.
export function parseExposition(bytes) {
  const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  assert.ok(text.endsWith('\n'), 'the page does not end with a newline');
  const types = new Map(), helps = new Map(), seen = new Set(), closed = new Set();
  const samples = [];
  let current = null;
  const family = (name) => {
    for (const suffix of ['_bucket', '_sum', '_count'])
      if (name.endsWith(suffix) && types.get(name.slice(0, -suffix.length)) === 'histogram')
        return name.slice(0, -suffix.length);
    return name;
  };
  const enter = (fam, where) => {
    if (fam === current) return;
    if (closed.has(fam)) throw new Error(`${where}: family ${fam} split`);
    if (current) closed.add(current);
    current = fam;
  };
  text.slice(0, -1).split('\n').forEach((line, n) => {
    const where = `line ${n + 1} ${JSON.stringify(line)}`;
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
      if (!m) throw new Error(`${where}: a comment that is not HELP or TYPE`);
      const [, kind, name, rest] = m;
      if (!NAME.test(name)) throw new Error(`${where}: bad metric name`);
      enter(name, where);
      if (kind === 'HELP') {
        if (helps.has(name)) throw new Error(`${where}: HELP twice`);
        helps.set(name, unescapeHelp(rest, where));
      } else {
        if (types.has(name)) throw new Error(`${where}: TYPE twice`);
        if (!TYPES.has(rest)) throw new Error(`${where}: unknown type`);
        if (samples.some((s) => family(s.name) === name)) throw new Error(`${where}: TYPE after samples`);
        types.set(name, rest);
      }
      return;
    }
    const m = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line);
    if (!m) throw new Error(`${where}: bad metric name`);
    const name = m[0];
    let labels = {}, i = name.length;
    if (line[i] === '{') [labels, i] = parseLabels(line, i, where);
    const rest = line.slice(i);
    const v = /^ (\S+)(?: (-?\d+))?$/.exec(rest);
    if (!v || !FLOAT.test(v[1])) throw new Error(`${where}: bad value`);
    const fam = family(name);
    if (!types.has(fam)) throw new Error(`${where}: no TYPE for ${fam}`);
    enter(fam, where);
    if (name.endsWith('_bucket') && fam !== name && !('le' in labels)) throw new Error(`${where}: bucket without le`);
    const key = name + JSON.stringify(Object.entries(labels).sort());
    if (seen.has(key)) throw new Error(`${where}: series twice`);
    seen.add(key);
    for (const l of Object.keys(labels)) if (!LABEL.test(l)) throw new Error(`${where}: bad label ${l}`);
    samples.push({ name, labels, value: Number(v[1].replace(/^([+-]?)[Ii]nf(inity)?$/, '$1Infinity')) });
  });
  for (const [fam, type] of types)
    if (type === 'histogram')
      for (const s of ['_sum', '_count'])
        assert.ok(samples.some((x) => x.name === fam + s), `histogram ${fam} lacks ${s}`);
  return samples;
}

test('the strict parser refuses what a Prometheus scrape refuses', () => {
  const ok = Buffer.from('# HELP a_b A \\\\ and \\n.\n# TYPE a_b gauge\na_b{m="q\\"x\\\\y\\nz"} 1.5e3\n');
  assert.deepEqual(parseExposition(ok).map((s) => [s.labels.m, s.value]), [['q"x\\y\nz', 1500]]);
  const bad = [
    '# TYPE a gauge\na{m="q"uote"} 1\n', // an unescaped quote
    '# TYPE a gauge\na{m="a\\qb"} 1\n', // an unknown escape
    '# TYPE a gauge\na{m="x\n"} 1\n', // a raw newline
    '# TYPE a gauge\na{m="x"} one\n', // not a float
    '# TYPE a gauge\na 1\na 2\n', // a series twice
    'a 1\n', // no TYPE
    '# TYPE a gauge\na 1', // no final newline
    '# HELP a x \\t\n# TYPE a gauge\na 1\n', // a bad HELP escape
    '# HELP 1a x\n', // a bad name
  ].map((s) => Buffer.from(s));
  bad.push(Buffer.from([...Buffer.from('# TYPE a gauge\na{m="'), 0xff, ...Buffer.from('"} 1\n')]));
  for (const b of bad) assert.throws(() => parseExposition(b), undefined, JSON.stringify(b.toString('latin1')));
});

// The names a --models-dir may hold: those that keep the rule of model names (UTF-8 without
// control characters, at most 127 bytes) are served and listed everywhere, whatever they
// hold; the others are said on stderr and skipped.
test('odd model names: /metrics parses, /v1/models and /health list every model served', async () => {
  const root = mkdtempSync(path.join(os.tmpdir(), 'atlas-odd-'));
  const qwen = path.join(DATA, 'tiny-qwen3');
  const quote = 'q"uote', slash = 'back\\slash', accents = 'caf\u00e9-\u00fc', nl = 'new\nline';
  for (const name of [quote, slash, accents, nl]) symlinkSync(qwen, path.join(root, name));
  // a name that is not UTF-8: two bytes that start no character
  symlinkSync(qwen, Buffer.concat([Buffer.from(`${root}/bad`), Buffer.from([0xff, 0xfe]), Buffer.from('utf8')]));
  const longest = 'n'.repeat(127);
  // a name that keeps the rule, in a directory whose path is not UTF-8
  const srv = await startServer(['--models-dir', root, '--model', `${longest}=${qwen}`],
                                { shellWords: `--model "bytes=${root}/$(printf 'bad\\377\\376utf8')"` });
  try {
    const log = srv.log();
    assert.match(log, /--models-dir .*: skipping a directory: model name "new\\nline": control character U\+000A at byte 3/);
    assert.match(log, /--models-dir .*: skipping a directory: model name "bad\\xFF\\xFEutf8": not UTF-8 at byte 3/);
    const want = [quote, slash, accents, longest, 'bytes'].sort();
    const models = await getJSON(srv.base, '/v1/models');
    assert.equal(models.status, 200, models.text);
    assert.deepEqual(models.json.data.map((m) => m.id).sort(), want);
    assert.equal(models.json.data.find((m) => m.id === 'bytes').root, `${root}/bad\ufffd\ufffdutf8`);
    const health = await getJSON(srv.base, '/health');
    assert.equal(health.status, 200, health.text);
    assert.equal(health.json.models, want.length);
    assert.deepEqual(health.json.model_states.map((m) => m.id).sort(), want);
    // a model asked for by a name that is not UTF-8: the error keeps the valid characters
    const missing = await getJSON(srv.base, '/v1/models/caf%C3%A9%FF');
    assert.equal(missing.status, 404, missing.text);
    assert.equal(missing.json.error.message, "the model 'caf\u00e9\ufffd' does not exist");
    const res = await fetch(`${srv.base}/metrics`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
    const samples = parseExposition(Buffer.from(await res.arrayBuffer()));
    for (const metric of ['atlas_model_kv_capacity_tokens', 'atlas_model_context_tokens']) {
      const of = samples.filter((s) => s.name === metric);
      assert.deepEqual(of.map((s) => s.labels.model).sort(), want, metric);
      assert.ok(of.every((s) => s.value > 0), JSON.stringify(of));
    }
    assert.ok(samples.some((s) => s.name === 'atlas_request_duration_seconds_count'));
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
    rmSync(root, { recursive: true, force: true });
  }
});

// The series a gateway and dashboards read: the model-server protocol's gauges, the prefix
// cache's queries and hits, and the latency histograms, each total unlabelled and each model
// labelled model_name (a name with a quote, so the label goes out escaped); they move with
// the requests.
test('gateway gauges and per-model series exist, parse and move', async () => {
  const MODEL = 'll"ama';
  // --step-ahead on: the CPU queues a plain request's decode steps too (counted below)
  const srv = await startServer(['--device', 'cpu', '--step-ahead', 'on', '--model', `${MODEL}=${path.join(DATA, 'tiny-llama3')}`]);
  const scrape = async () => {
    const res = await fetch(`${srv.base}/metrics`);
    assert.equal(res.status, 200);
    return parseExposition(Buffer.from(await res.arrayBuffer()));
  };
  const one = (samples, name, labels = {}) => {
    const of = samples.filter((s) => s.name === name &&
      JSON.stringify(Object.entries(s.labels).filter(([k]) => k !== 'le').sort()) === JSON.stringify(Object.entries(labels).sort()));
    assert.equal(of.length, 1, `${name} ${JSON.stringify(labels)}: ${JSON.stringify(of)}`);
    return of[0].value;
  };
  const per = { model_name: MODEL };
  try {
    const s0 = await scrape();
    for (const g of ['atlas_num_requests_waiting', 'atlas_num_requests_running']) {
      assert.equal(one(s0, g), 0);
      assert.equal(one(s0, g, per), 0);
    }
    const info = s0.filter((s) => s.name === 'atlas_cache_config_info');
    const mine = info.find((s) => s.labels.model_name === MODEL);
    assert.ok(mine && mine.value === 1 && Number(mine.labels.block_size) > 0 && Number(mine.labels.num_gpu_blocks) > 0, JSON.stringify(info));
    assert.ok(info.some((s) => !('model_name' in s.labels) && s.labels.block_size === mine.labels.block_size));
    for (const name of ['atlas_prefix_cache_queries_total', 'atlas_prefix_cache_hits_total', 'atlas_request_queue_time_seconds_count', 'atlas_steps_ahead_total'])
      assert.equal(one(s0, name), 0, name);
    // a prompt of several blocks, asked twice: the second finds it in the prefix cache
    const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(12);
    const ask = async () => {
      const r = await fetch(`${srv.base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: 4, temperature: 0, ignore_eos: true }) });
      assert.equal(r.status, 200);
      return (await r.json()).usage;
    };
    const u1 = await ask();
    const s1 = await scrape();
    for (const labels of [{}, per]) {
      assert.equal(one(s1, 'atlas_request_queue_time_seconds_count', labels), 1);
      assert.equal(one(s1, 'atlas_prefix_cache_queries_total', labels), u1.prompt_tokens);
      assert.equal(one(s1, 'atlas_request_success_total', labels), 1);
      assert.equal(one(s1, 'atlas_request_prefill_time_seconds_count', labels), 1);
      assert.equal(one(s1, 'atlas_request_decode_time_seconds_count', labels), 1);
    }
    // its prompt's step and 3 decode steps queued one after another: 3 while the one before ran
    assert.equal(one(s1, 'atlas_steps_ahead_total'), 3);
    assert.equal(one(s1, 'atlas_time_to_first_token_seconds_count', per), 1);
    assert.equal(one(s1, 'atlas_inter_token_latency_seconds_count', per), 3);
    const usage = one(s1, 'atlas_kv_cache_usage_perc', per);
    assert.ok(usage >= 0 && usage <= 1, String(usage));
    const u2 = await ask();
    assert.ok(u2.prompt_tokens_details.cached_tokens > 0, JSON.stringify(u2));
    const s2 = await scrape();
    for (const labels of [{}, per]) {
      assert.equal(one(s2, 'atlas_prefix_cache_hits_total', labels),
        one(s1, 'atlas_prefix_cache_hits_total', labels) + u2.prompt_tokens_details.cached_tokens);
      assert.equal(one(s2, 'atlas_prefix_cache_queries_total', labels), u1.prompt_tokens + u2.prompt_tokens);
      assert.equal(one(s2, 'atlas_request_queue_time_seconds_count', labels), 2);
    }
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
  }
});

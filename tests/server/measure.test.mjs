// What `atlas run` and `atlas bench` measure and print, run as a user runs them (spawnSync of
// ATLAS_BIN) on the default model and the CPU: the time to the first token and the rate of
// the tokens after it, whatever the first token is; --ignore-eos; a logprob for every --json
// token; bench's --threads, every --load-only repetition and the first, cold prefill.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';

const BIN = process.env.ATLAS_BIN;
const atlas = (args) => {
  const t0 = process.hrtime.bigint();
  const r = spawnSync(BIN, args, { input: '', encoding: 'utf8', timeout: 120000 });
  r.wall = Number(process.hrtime.bigint() - t0) / 1e9;
  return r;
};
const run = (args) => atlas(['run', '--device', 'cpu', '--temp', '0', ...args]);
const jsonLines = (r) => r.stdout.trim().split('\n').map((l) => JSON.parse(l));

// The default model's greedy continuation of this prompt is its end-of-sequence token.
const ENDS_AT_ONCE = 'The end.';

// "prompt: N tokens, first token after T s (R tok/s); generation: ..." (the last line)
const speeds = (stderr) => {
  const line = stderr.trim().split('\n').at(-1);
  const p = line.match(/^prompt: (\d+) tokens, first token after (-?[\d.]+) s \((-?[\d.]+) tok\/s\); /);
  assert.ok(p, line);
  const g = line.match(/generation: (\d+) tokens?, (?:the (\d+) after the first in (-?[\d.]+) s \((-?[\d.]+) tok\/s\)|no rate \(none after the first\)) \[cpu\] seed \d+$/);
  assert.ok(g, line);
  return { prompt: +p[1], ttft: +p[2], promptRate: +p[3], gen: +g[1],
           after: g[2] === undefined ? null : +g[2], tGen: g[3] === undefined ? null : +g[3],
           rate: g[4] === undefined ? null : +g[4], line };
};

test('run: an end-of-sequence first token has its time to first token and its logprob', () => {
  const r = run(['-n', '4', '-p', ENDS_AT_ONCE, '--json', '--top-logprobs', '3']);
  assert.equal(r.status, 0, r.stderr);
  const lines = jsonLines(r);
  assert.equal(lines.length, 2, r.stdout);
  assert.equal(lines[1].finish_reason, 'stop', 'precondition: the first greedy token ends it');
  const eos = lines[0];
  assert.equal(eos.text, '');
  assert.ok(Number.isFinite(eos.logprob) && eos.logprob <= 0, r.stdout);
  // greedy: the token taken is the most likely one, so its logprob is the first of the top 3
  assert.equal(eos.top_logprobs.length, 3, r.stdout);
  assert.deepEqual(eos.top_logprobs[0], { id: eos.id, logprob: eos.logprob });
  const s = speeds(r.stderr);
  assert.equal(s.gen, 1);
  assert.equal(s.after, null, 'no rate from one token');
  assert.ok(s.ttft > 0 && s.ttft <= r.wall, `${s.line} (the process ran ${r.wall} s)`);
  assert.ok(s.promptRate > 0, s.line);
  // the same without --json
  const plain = speeds(run(['-n', '4', '-p', ENDS_AT_ONCE]).stderr);
  assert.ok(plain.ttft > 0 && plain.gen === 1, plain.line);
});

test('run: the tokens after the first are timed apart from it', () => {
  // a one-token prompt decodes from its first step on: every step is a one-token forward
  // (at least 2 after the first, so that their time shows at the printed millisecond)
  for (const n of ['3', '9']) {
    const r = run(['-n', n, '--prompt-ids', '572', '--ignore-eos']);
    assert.equal(r.status, 0, r.stderr);
    const s = speeds(r.stderr);
    assert.equal(s.gen, +n, s.line);
    assert.equal(s.after, +n - 1, s.line);
    assert.ok(s.ttft > 0 && s.tGen > 0 && s.ttft + s.tGen <= r.wall, `${s.line} (${r.wall} s)`);
    // the rate is of the tokens after the first over their time (the time printed to the
    // millisecond, the rate to 0.1 tok/s: both roundings bound the difference)
    const slack = 0.0005 + (s.after * 0.05) / (s.rate * s.rate) + 1e-6;
    assert.ok(s.rate > 0 && Math.abs(s.after / s.rate - s.tGen) <= slack, s.line);
  }
});

test('run --ignore-eos generates past the end-of-sequence token', () => {
  const r = run(['-n', '4', '-p', ENDS_AT_ONCE, '--json', '--ignore-eos']);
  assert.equal(r.status, 0, r.stderr);
  const lines = jsonLines(r);
  const tokens = lines.filter((l) => 'id' in l);
  assert.equal(tokens.length, 4, r.stdout);
  assert.equal(lines.at(-1).finish_reason, 'length');
  const stopped = jsonLines(run(['-n', '4', '-p', ENDS_AT_ONCE, '--json']));
  assert.equal(tokens[0].id, stopped[0].id, 'the same first token, which no longer ends it');
  for (const t of tokens) assert.ok(Number.isFinite(t.logprob), JSON.stringify(t));
  assert.equal(speeds(r.stderr).gen, 4);
  assert.match(atlas(['run', '--help']).stdout, /--ignore-eos/);
});

test('bench --threads sets the CPU workers; a bad count is refused', () => {
  const r = atlas(['bench', '--device', 'cpu', '-p', '16', '-n', '4', '--reps', '1', '--threads', '1']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /\nthreads +1\n/);
  // the first, cold prefill beside the warm median
  assert.match(r.stdout, /\nprefill +16 tokens: .*\(median of 1; the first, cold: [\d.]+ ms, \d+ tok\/s, \d+% of the median's rate; CPU time [\d.]+ s, the first [\d.]+ s\)\n/);
  for (const bad of ['0', 'two']) {
    const b = atlas(['bench', '--device', 'cpu', '--threads', bad]);
    assert.equal(b.status, 2, bad);
  }
});

test('bench --load-only N prints every load on the CPU', () => {
  const r = atlas(['bench', '--device', 'cpu', '--load-only', '3']);
  assert.equal(r.status, 0, r.stderr);
  const loads = r.stdout.split('\n').filter((l) => /^load +swap \d+: [\d.]+ s, [\d.]+ GB\/s$/.test(l));
  assert.equal(loads.length, 3, r.stdout);
  assert.doesNotMatch(r.stdout, /\nprefill/);
});

// The `atlas` command's rough edges (issue 26): what it prints and how it fails, run as a
// user runs it (spawnSync of ATLAS_BIN), on the default model and the CPU.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, DEFAULT } from './lib.mjs';

const BIN = process.env.ATLAS_BIN;
const atlas = (args, input, env) =>
  spawnSync(BIN, args, { input: input ?? '', encoding: 'utf8', timeout: 120000,
                         env: { ...process.env, ...env } });
const run = (args, input) => atlas(['run', '--device', 'cpu', '-n', '6', ...args], input);

test('run ends its text with a newline, also when piped, and never with a second one', () => {
  // the piped text is the tokens' text (as --json gives it) and one newline, unless that
  // text already ends with one: seed 12 makes this prompt's first token ".\n"
  for (const [prompt, seed, n] of [['Once upon a time', '1', '6'], ['Chapter 1', '12', '1']]) {
    const args = ['run', '--device', 'cpu', '-n', n, '--seed', seed, '-p', prompt];
    const r = atlas(args);
    assert.equal(r.status, 0, r.stderr);
    const j = atlas([...args, '--json']);
    assert.equal(j.status, 0, j.stderr);
    const text = j.stdout.trim().split('\n').map((l) => JSON.parse(l))
      .filter((e) => 'text' in e).map((e) => e.text).join('');
    assert.ok(text.length > 0, 'generated something');
    assert.equal(r.stdout, text.endsWith('\n') ? text : text + '\n', JSON.stringify(r.stdout));
    if (seed === '12') assert.ok(text.endsWith('\n'), `the case under test: ${JSON.stringify(text)}`);
  }
});

test('run -p - reads the prompt from stdin, -f FILE from a file', () => {
  // one seed, so that the same prompt gives the same text however it came
  const run = (args, input) => atlas(['run', '--device', 'cpu', '-n', '6', '--seed', '1', ...args], input);
  const prompt = 'The king said unto them';
  const direct = run(['-p', prompt]);
  assert.equal(direct.status, 0, direct.stderr);
  const stdin = run(['-p', '-'], prompt);
  assert.equal(stdin.status, 0, stdin.stderr);
  assert.equal(stdin.stdout, direct.stdout);
  const dir = mkdtempSync(join(tmpdir(), 'atlas-cli-'));
  try {
    writeFileSync(join(dir, 'prompt.txt'), prompt);
    const file = run(['-f', join(dir, 'prompt.txt')]);
    assert.equal(file.status, 0, file.stderr);
    assert.equal(file.stdout, direct.stdout);
    const missing = run(['-f', join(dir, 'absent.txt')]);
    assert.equal(missing.status, 1);
    assert.match(missing.stderr, /absent\.txt: No such file/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  // the prompt's token count, printed on stderr, is that of the text, not of "-"
  const count = (r) => Number(r.stderr.match(/prompt: (\d+) tokens/)[1]);
  assert.ok(count(direct) > 3);
  assert.equal(count(stdin), count(direct));
});

test('an unknown option is named, with the nearest valid one', () => {
  const cases = [
    [['run', '--ctx-sise', '8'], 'run', '--ctx-sise', '--ctx-size'],
    [['serve', '--prot', '8080'], 'serve', '--prot', '--port'],
    [['info', '--devcie', 'cpu'], 'info', '--devcie', '--device'],
    [['bench', '--raps', '2'], 'bench', '--raps', '--reps'],
    [['tokenize', '--add-specail', 'x'], 'tokenize', '--add-specail', '--add-special'],
    [['template', '--tool-fromat'], 'template', '--tool-fromat', '--tool-format'],
  ];
  for (const [args, cmd, bad, near] of cases) {
    const r = atlas(args);
    assert.equal(r.status, 2, args.join(' '));
    assert.ok(r.stderr.includes(`atlas ${cmd}: unknown option '${bad}'; did you mean '${near}'?`),
              r.stderr);
  }
  const far = atlas(['run', '--zzzzzzzz']);
  assert.equal(far.status, 2);
  assert.match(far.stderr, /unknown option '--zzzzzzzz' \(see --help\)/);
  // a known option without its value is still told as such
  const novalue = atlas(['serve', '--port']);
  assert.equal(novalue.status, 2);
  assert.match(novalue.stderr, /--port needs a value/);
});

test('--version names the version, the commit, the GPU targets and CUDA', () => {
  const r = atlas(['--version']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^atlas \d+\.\d+\.\d+ \(commit (?:[0-9a-f]{4,}|unknown)\)\n/);
  assert.match(r.stdout, /\ngpu targets: \S/);
  assert.match(r.stdout, /\ncuda: (found: .+|not found \(.+\))\n/);
});

test('bench picks the device as run does (auto: the CPU without a GPU)', () => {
  const r = atlas(['bench', '-p', '16', '-n', '4', '--reps', '1', '--gemm', '128']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /\nbackend +(cpu|cuda)/);
  assert.match(r.stdout, /\ndecode /);
});

test('serve: an empty or unreadable --models-dir is an error', () => {
  const dir = mkdtempSync(join(tmpdir(), 'atlas-md-'));
  try {
    mkdirSync(join(dir, 'not-a-model'));
    const empty = atlas(['serve', '--models-dir', dir, '--port', '0', '--device', 'cpu']);
    assert.equal(empty.status, 2, empty.stderr);
    assert.match(empty.stderr, /--models-dir .*: no subdirectory with a config\.json/);
    const absent = atlas(['serve', '--models-dir', join(dir, 'absent'), '--port', '0']);
    assert.equal(absent.status, 2, absent.stderr);
    assert.match(absent.stderr, /absent: No such file or directory/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('serve: a --model name that breaks the rule of model names is refused at start', () => {
  const dir = join(process.env.ATLAS_TEST_DATA, 'tiny-qwen3');
  const cases = [
    [`line\nfeed=${dir}`, /--model: model name "line\\nfeed": control character U\+000A at byte 4: a model name is 1 to 127 bytes of UTF-8 without control characters\n/],
    [`${'x'.repeat(128)}=${dir}`, /--model: model name "x{80}\.\.\.": 128 bytes long: a model name is 1 to 127/],
    [`tab\there=${dir}`, /--model: model name "tab\\x09here": control character U\+0009 at byte 3/],
  ];
  for (const [spec, want] of cases) {
    const r = atlas(['serve', '--model', spec, '--port', '0', '--device', 'cpu']);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, want);
  }
  // bytes that are not UTF-8, in NAME and in DIR's last component (the name it defaults to);
  // argv carries them only through a shell
  const sh = (arg) => spawnSync('sh', ['-c', `exec "$ATLAS_BIN" serve --port 0 --device cpu --model "${arg}"`],
                                { encoding: 'utf8', timeout: 30000 });
  const named = sh(`$(printf 'caf\\303\\251\\377')=${dir}`);
  assert.equal(named.status, 2, named.stderr);
  assert.match(named.stderr, /--model: model name "café\\xFF": not UTF-8 at byte 5: .*characters\n/);
  const root = mkdtempSync(join(tmpdir(), 'atlas-name-'));
  try {
    const last = sh(`${root}/$(printf 'bad\\377')`);
    assert.equal(last.status, 2, last.stderr);
    assert.match(last.stderr, /model name "bad\\xFF": not UTF-8 at byte 3: .* \(DIR's last component; give another with NAME=DIR\)/);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('template --tool-format says what the server will parse', () => {
  // the default model's template has no tool calls; the server then goes by its
  // architecture (LlamaForCausalLM: the Llama 3 format), and so must this
  const r = atlas(['template', '--tool-format']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, 'llama3\n');
});

test('a driver older than the toolkit needs is refused naming both versions', () => {
  // tests/old_libcuda.c: a libcuda.so whose cuDriverGetVersion says CUDA 11.2
  const env = { ATLAS_LIBCUDA: process.env.ATLAS_OLD_LIBCUDA };
  assert.ok(env.ATLAS_LIBCUDA, 'ATLAS_OLD_LIBCUDA is set by tests/scripts.cmake');
  const want = /the CUDA driver supports CUDA 11\.2; atlas needs 1\d\.\d or newer/;
  const v = atlas(['--version'], '', env);
  assert.equal(v.status, 0, v.stderr);
  assert.match(v.stdout, /\ncuda: not found \(/);
  assert.match(v.stdout, want);
  const r = atlas(['run', '--device', 'cuda', '-n', '2'], '', env);
  assert.equal(r.status, 1);
  assert.match(r.stderr, want);
});

test('run draws a seed when none is given: --json and stderr show it, --seed reproduces', () => {
  const sampled = (extra) => atlas(['run', '--device', 'cpu', '--temp', '0.7', '-n', '24', ...extra]);
  const json = (r) => r.stdout.trim().split('\n').map((l) => JSON.parse(l));
  const a = sampled(['--json']), b = sampled(['--json']);
  assert.equal(a.status, 0, a.stderr);
  assert.equal(b.status, 0, b.stderr);
  const [la, lb] = [json(a), json(b)];
  const [sa, sb] = [la.at(-1), lb.at(-1)];
  assert.ok(Number.isSafeInteger(sa.seed) && Number.isSafeInteger(sb.seed), a.stdout);
  assert.notEqual(sa.seed, sb.seed);
  const text = (lines) => lines.filter((l) => 'id' in l).map((l) => l.text).join('');
  assert.notEqual(text(la), text(lb), 'two runs without a seed sample differently');
  // the seed a run drew reproduces its text; stderr names it too
  const again = sampled(['--json', '--seed', String(sa.seed)]);
  assert.equal(text(json(again)), text(la));
  const plain = sampled(['--seed', '42']), plain2 = sampled(['--seed', '42']);
  assert.equal(plain.stdout, plain2.stdout);
  assert.match(plain.stderr, / seed 42\n/);
});

// A conversation longer than the context (128 tokens here, 1,024 by default): the oldest
// exchanges are dropped, said on stderr, and the chat goes on, in process and through a
// server alike; a message that does not fit even alone is refused and changes nothing.
test('chat drops its oldest turns when the conversation outgrows the context', async () => {
  const turns = ['Hello there, tell me of the kings of old.', 'And then what happened to them?',
                 'Tell me more of the story now.', 'What of the prophets?', 'And the people?'];
  const long = Array(200).fill('word').join(' ');
  const script = (lines) => ['/set temp 0', '/set max 24', ...lines].join('\n') + '\n';
  const srv = await startServer(['--model', DEFAULT, '--device', 'cpu', '--ctx-size', '128']);
  try {
    for (const where of [['-m', DEFAULT.split('=')[1], '--device', 'cpu', '--ctx-size', '128'],
                         ['--url', srv.base]]) {
      const chat = (lines) => atlas(['chat', ...where], script(lines));
      const r = chat(turns);
      assert.equal(r.status, 0, r.stderr);
      const notes = r.stderr.split('\n').filter((l) => l.startsWith('atlas chat:'));
      assert.ok(notes.length >= 1, r.stderr);
      for (const l of notes)
        assert.match(l, /^atlas chat: dropped the \d+ oldest turns? \(a message and its answer\) to fit the 128-token context \(\/clear forgets the conversation\)$/);
      assert.ok(r.stdout.trim().split('\n').length >= turns.length, r.stdout);
      // a message too long alone: refused, the conversation kept, the next turn answered
      // as if it had not been typed (greedy: the same text); the script then exits 1
      const withLong = chat([...turns.slice(0, 3), long, ...turns.slice(3)]);
      assert.equal(withLong.status, 1, withLong.stderr);
      assert.match(withLong.stderr, /atlas chat: this message has \d+ tokens in the chat template; the context holds 128: not sent/);
      assert.equal(withLong.stdout, r.stdout);
    }
  } finally {
    await srv.stop();
  }
});

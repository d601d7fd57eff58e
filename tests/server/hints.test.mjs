// What atlas says to a user who comes from llama.cpp, Ollama or vLLM and tries what works
// there first: the model given in a form atlas does not read, their options and commands, a
// wrong HTTP method, a GPU that is not there, a context too small; and `atlas export` run
// twice. Run as a user runs it (spawnSync of ATLAS_BIN), on the default model and the CPU.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, mkdirSync, rmSync, readFileSync, unlinkSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, postJSON } from './lib.mjs';

const BIN = process.env.ATLAS_BIN;
const atlas = (args, { input, env, cwd } = {}) =>
  spawnSync(BIN, args, { input: input ?? '', encoding: 'utf8', timeout: 120000, cwd,
                         env: { ...process.env, ...env } });

// A temporary directory for the test's files, removed afterwards.
function scratch(fn) {
  const dir = mkdtempSync(join(tmpdir(), 'atlas-hints-'));
  try { return fn(dir); } finally { rmSync(dir, { recursive: true, force: true }); }
}

// The embedded model written out as a Hugging Face directory.
function exported(dir, name = 'kjv') {
  const d = join(dir, name);
  const r = atlas(['export', d]);
  assert.equal(r.status, 0, r.stderr);
  return d;
}

const NOT_GGUF = /GGUF is not read; atlas serves Hugging Face model directories \(config\.json, tokenizer\.json, \*\.safetensors\): `huggingface-cli download ORG\/NAME --local-dir DIR`/;

test('a GGUF file, or a directory of them, is named as such', () => scratch((dir) => {
  const file = join(dir, 'model.gguf');
  writeFileSync(file, 'GGUF\x03\x00\x00\x00');
  for (const cmd of [['run', '-n', '2'], ['info'], ['chat']]) {
    const r = atlas([...cmd, '-m', file, '--device', 'cpu']);
    assert.equal(r.status, 1, `${cmd[0]}: ${r.stderr}`);
    assert.ok(r.stderr.startsWith(`atlas ${cmd[0]}: ${file}: a GGUF file: `), r.stderr);
    assert.match(r.stderr, NOT_GGUF);
  }
  // by its magic, whatever its name
  const renamed = join(dir, 'weights');
  writeFileSync(renamed, 'GGUF\x03\x00\x00\x00');
  assert.match(atlas(['run', '-m', renamed]).stderr, /weights: a GGUF file: GGUF is not read/);
  const gg = join(dir, 'gguf-dir');
  mkdirSync(gg);
  writeFileSync(join(gg, 'llama-3.2-1b-q4_k_m.gguf'), 'GGUF');
  const r = atlas(['run', '-m', gg]);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /gguf-dir: GGUF files \(llama-3\.2-1b-q4_k_m\.gguf\), no config\.json: GGUF is not read/);
}));

test('serve --models-dir reports the GGUF files and cache entries it skips', () => scratch((dir) => {
  writeFileSync(join(dir, 'qwen2.5-7b-q4.gguf'), 'GGUF');
  mkdirSync(join(dir, 'models--Qwen--Qwen2.5-7B', 'snapshots', 'a1b2c3'), { recursive: true });
  mkdirSync(join(dir, 'notes'));
  const only = atlas(['serve', '--models-dir', dir, '--port', '0', '--device', 'cpu']);
  assert.equal(only.status, 2, only.stderr);
  assert.match(only.stderr, /--models-dir: skipping .*qwen2\.5-7b-q4\.gguf: a GGUF file: GGUF is not read/);
  assert.match(only.stderr, /skipping .*models--Qwen--Qwen2\.5-7B: a Hugging Face cache entry.*snapshots\/a1b2c3/);
  assert.doesNotMatch(only.stderr, /notes/, 'a directory that holds no model is no news');
  assert.match(only.stderr, /no subdirectory with a config\.json \(what it holds is said above\)/);
  // beside a model it serves, the report is the same (--help ends before anything loads)
  exported(dir);
  const mixed = atlas(['serve', '--models-dir', dir, '--help']);
  assert.equal(mixed.status, 0, mixed.stderr);
  assert.match(mixed.stderr, /skipping .*qwen2\.5-7b-q4\.gguf: a GGUF file/);
}));

test('.bin weights are named with the path; errors name the model, never run or chat', () => scratch((dir) => {
  const d = exported(dir, 'llama-bin');
  unlinkSync(join(d, 'model.safetensors'));
  writeFileSync(join(d, 'pytorch_model.bin'), 'PK\x03\x04');
  const want = `${d}/pytorch_model.bin: PyTorch .bin weights are not read; atlas reads safetensors`;
  const run = atlas(['run', '-m', d, '--device', 'cpu', '-n', '2']);
  assert.equal(run.status, 1);
  assert.ok(run.stderr.includes(want), run.stderr);
  assert.match(run.stderr, /huggingface-cli download ORG\/NAME --include '\*\.safetensors'/);
  const chat = atlas(['chat', '-m', d, '--device', 'cpu'], { input: 'Hello\n' });
  assert.equal(chat.status, 1);
  assert.ok(chat.stderr.includes(want), chat.stderr);
  const info = atlas(['info', '-m', d, '--device', 'cpu']);
  assert.ok(info.stderr.includes(want), info.stderr);
  for (const r of [run, chat, info]) assert.doesNotMatch(r.stderr, /'run'|'chat'/);
}));

// A named pipe where a file should be is refused at once (opening it would wait for a
// writer, and a server's start with it); a broken link (a Hugging Face cache's missing blob)
// is an error naming it, not an absent file whose settings are dropped without a word.
test('a named pipe or a broken link in a model directory is an error, not a wait or a default', () => scratch((dir) => {
  for (const name of ['config.json', 'tokenizer.json', 'model.safetensors', 'generation_config.json']) {
    const d = exported(dir, `fifo-${name}`);
    unlinkSync(join(d, name));
    assert.equal(spawnSync('mkfifo', [join(d, name)]).status, 0);
    const r = atlas(['info', '-m', d, '--device', 'cpu', '--load']);
    assert.equal(r.status, 1, `${name}: ${r.stderr}`);
    assert.match(r.stderr, new RegExp(`${name.replace('.', '\\.')}: not a regular file`), r.stderr);
  }
  for (const name of ['generation_config.json', 'tokenizer_config.json', 'model.safetensors']) {
    const d = exported(dir, `link-${name}`);
    unlinkSync(join(d, name));
    symlinkSync(join(dir, 'no-such-blob'), join(d, name));
    const r = atlas(['run', '-m', d, '--device', 'cpu', '-n', '2', '-p', 'hi']);
    assert.equal(r.status, 1, `${name}: ${r.stderr}`);
    assert.match(r.stderr, new RegExp(`${name.replace('.', '\\.')}: cannot open: No such file`), r.stderr);
  }
}));

test('a hub id, a bare name and a cache entry get the download command or the snapshot', () => scratch((dir) => {
  const hub = atlas(['run', '-m', 'Qwen/Qwen2.5-7B-Instruct'], { cwd: dir });
  assert.equal(hub.status, 1);
  assert.match(hub.stderr, /Qwen\/Qwen2\.5-7B-Instruct: no such directory; atlas reads models from disk and downloads none/);
  assert.ok(hub.stderr.includes('`huggingface-cli download Qwen/Qwen2.5-7B-Instruct --local-dir ~/models/Qwen2.5-7B-Instruct`'), hub.stderr);
  const bare = atlas(['run', '--model', 'llama3'], { cwd: dir });
  assert.equal(bare.status, 1);
  assert.match(bare.stderr, /llama3: no such directory; .*`huggingface-cli download ORG\/NAME --local-dir ~\/models\/llama3`/);
  // a cache entry: snapshots/<revision> with what refs/main names
  const cache = join(dir, 'models--org--name');
  mkdirSync(join(cache, 'snapshots', 'old'), { recursive: true });
  mkdirSync(join(cache, 'snapshots', '0123abcd'), { recursive: true });
  mkdirSync(join(cache, 'refs'));
  writeFileSync(join(cache, 'refs', 'main'), '0123abcd');
  const r = atlas(['run', '-m', cache]);
  assert.equal(r.status, 1);
  assert.ok(r.stderr.includes(`a Hugging Face cache entry, not a model directory: the model is in snapshots/<revision>, here ${cache}/snapshots/0123abcd`), r.stderr);
  // and a file of a model directory: its directory
  const d = exported(dir);
  assert.match(atlas(['run', '-m', join(d, 'config.json')]).stderr,
               /config\.json: a file; give the directory that holds it \(.*kjv\)/);
}));

test('the options other tools spell are taken where they mean the same', () => scratch((dir) => {
  writeFileSync(join(dir, 'prompt.txt'), 'And God said');
  const base = ['run', '--device', 'cpu'];
  const ours = atlas([...base, '-n', '5', '--temp', '0', '-f', join(dir, 'prompt.txt'), '--ctx-size', '128']);
  assert.equal(ours.status, 0, ours.stderr);
  const theirs = atlas([...base, '--max-tokens', '5', '--temperature', '0', '--prompt-file',
                        join(dir, 'prompt.txt'), '-c', '128']);
  assert.equal(theirs.status, 0, theirs.stderr);
  assert.equal(theirs.stdout, ours.stdout);
  const python = atlas([...base, '--max_tokens', '5', '--n-predict', '5', '--temp', '0', '-f',
                        join(dir, 'prompt.txt')]);
  assert.equal(python.status, 0, python.stderr);
  assert.equal(python.stdout, ours.stdout);
  assert.match(ours.stderr, /generation: 5 tokens/);
  // what atlas does otherwise is said
  const ngl = atlas(['run', '--n-gpu-layers', '99']);
  assert.equal(ngl.status, 2);
  assert.match(ngl.stderr, /unknown option '--n-gpu-layers': atlas puts the whole model on one device: --device cuda/);
  assert.match(atlas(['run', '-i']).stderr, /unknown option '-i': atlas chat talks with a model/);
  assert.match(atlas(['serve', '--model-dir', dir]).stderr, /--models-dir ROOT every subdirectory/);
  // a typo of another tool's spelling still gets the nearest
  assert.match(atlas(['run', '--temprature', '1']).stderr, /did you mean '--temp'\?|did you mean '--temperature'\?/);
  // commands
  const runn = atlas(['runn']);
  assert.equal(runn.status, 2);
  assert.match(runn.stderr, /^atlas: unknown command 'runn'; did you mean 'run'\?\n$/);
  assert.match(atlas(['serv']).stderr, /did you mean 'serve'\?/);
  assert.match(atlas(['pull', 'llama3']).stderr, /atlas downloads no model: `huggingface-cli download/);
}));

test('a method a route does not take gets 405 with Allow', async () => {
  const srv = await startServer(['--device', 'cpu']);
  try {
    const get = await fetch(`${srv.base}/v1/models/default/load`);
    assert.equal(get.status, 405);
    assert.equal(get.headers.get('allow'), 'POST');
    const body = await get.json();
    assert.equal(body.error.code, 'method_not_allowed');
    assert.match(body.error.message, /GET \/v1\/models\/default\/load: method not allowed \(it takes POST\)/);
    const unload = await fetch(`${srv.base}/v1/models/x/unload`);
    assert.equal(unload.status, 405);
    const post = await postJSON(srv.base, '/v1/models/default', {});
    assert.equal(post.status, 405);
    assert.equal(post.headers.get('allow'), 'GET, HEAD');
    // HEAD wherever GET is (RFC 9110), headers alone; OPTIONS without an Origin lists them
    for (const path of ['/health', '/v1/models', '/api/tags', '/api/version', '/metrics']) {
      const head = await fetch(`${srv.base}${path}`, { method: 'HEAD' });
      assert.equal(head.status, 200, path);
      assert.equal(await head.text(), '', path);
    }
    assert.equal((await fetch(`${srv.base}/v1/chat/completions`, { method: 'HEAD' })).status, 405);
    const opt = await fetch(`${srv.base}/v1/models`, { method: 'OPTIONS' });
    assert.equal(opt.status, 204);
    assert.equal(opt.headers.get('allow'), 'GET, HEAD');
    const chat = await fetch(`${srv.base}/v1/chat/completions`);
    assert.equal(chat.status, 405);
    assert.equal(chat.headers.get('allow'), 'POST');
    // the routes themselves answer as before
    assert.equal((await fetch(`${srv.base}/v1/models/default`)).status, 200);
    assert.equal((await postJSON(srv.base, '/v1/models/default/load', '')).status, 200);
    const none = await fetch(`${srv.base}/v2/nothing`);
    assert.equal(none.status, 404);
    assert.equal(none.headers.get('allow'), null);
  } finally {
    await srv.stop();
  }
});

test('--device cuda where no driver loads offers --device cpu', () => scratch((dir) => {
  const env = { ATLAS_LIBCUDA: join(dir, 'no-such-libcuda.so.1') };
  const hint = /: no usable CUDA driver or GPU here: --device cpu runs on the CPU/;
  const d = exported(dir);
  const run = atlas(['run', '-m', d, '--device', 'cuda', '-n', '2'], { env });
  assert.equal(run.status, 1);
  assert.match(run.stderr, /^atlas run: loading model 'kjv': .*no-such-libcuda\.so\.1/m);
  assert.match(run.stderr, hint);
  for (const cmd of [['info'], ['chat'], ['bench', '-p', '8', '-n', '2']]) {
    const r = atlas([...cmd, '-m', d, '--device', 'cuda'], { env, input: 'Hi\n' });
    assert.equal(r.status, 1, cmd[0]);
    assert.match(r.stderr, hint, cmd[0]);
  }
  // --device auto runs on the CPU, and says nothing of it
  const auto = atlas(['run', '-m', d, '-n', '2'], { env });
  assert.equal(auto.status, 0, auto.stderr);
  assert.doesNotMatch(auto.stderr, hint);
}));

test('run -n past the context says that the context stopped it', () => {
  const r = atlas(['run', '--device', 'cpu', '-p', 'hi', '--temp', '0', '-n', '300', '--ctx-size', '64']);
  assert.equal(r.status, 0, r.stderr);
  const n = Number(r.stderr.match(/generation: (\d+) tokens/)[1]);
  const prompt = Number(r.stderr.match(/prompt: (\d+) tokens/)[1]);
  assert.equal(prompt + n, 64, r.stderr);
  assert.ok(r.stderr.includes(`atlas run: stopped after ${n} of -n 300 tokens: the 64-token context is full`), r.stderr);
  // within the context, nothing is said
  const short = atlas(['run', '--device', 'cpu', '-p', 'hi', '--temp', '0', '-n', '4', '--ctx-size', '64']);
  assert.equal(short.status, 0, short.stderr);
  assert.doesNotMatch(short.stderr, /context is full/);
});

test('atlas export replaces its own output, and nothing of a directory it did not write', () => scratch((dir) => {
  const d = join(dir, 'kjv');
  const first = atlas(['export', d]);
  assert.equal(first.status, 0, first.stderr);
  assert.match(readFileSync(join(d, '.atlas-export'), 'utf8'), /Written by `atlas export`/);
  writeFileSync(join(d, 'config.json'), '{"broken": true}');
  writeFileSync(join(d, 'notes.txt'), 'mine');
  const again = atlas(['export', d]);
  assert.equal(again.status, 0, again.stderr);
  assert.match(readFileSync(join(d, 'config.json'), 'utf8'), /LlamaForCausalLM/);
  assert.equal(readFileSync(join(d, 'notes.txt'), 'utf8'), 'mine', 'other files are left alone');
  const run = atlas(['run', '-m', d, '--device', 'cpu', '-n', '3']);
  assert.equal(run.status, 0, run.stderr);
  // a directory of the user's with a config.json of its own
  const mine = join(dir, 'mine');
  mkdirSync(mine);
  writeFileSync(join(mine, 'config.json'), '{"mine": 1}');
  const refused = atlas(['export', mine]);
  assert.equal(refused.status, 1);
  assert.match(refused.stderr, /mine\/config\.json exists and .*mine was not written by atlas export \(no \.atlas-export\): not overwritten/);
  assert.equal(readFileSync(join(mine, 'config.json'), 'utf8'), '{"mine": 1}');
}));

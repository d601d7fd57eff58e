// Checks made before work: a checkpoint larger than the machine's memory is refused before
// any weight is read, with both figures (and --no-memory-check loads it anyway); `atlas
// info` reads headers only; `atlas serve` binds its socket before it loads anything, so a
// port in use fails at once, and resolves the host it is given (--host localhost).
// Wall-clock bounds: registered RUN_SERIAL (tests/scripts.cmake).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import { BIN, DEFAULT, startServer } from './lib.mjs';
import { sparseCheckpoint } from './sparse.mjs';

const big = sparseCheckpoint();
after(() => rmSync(big.dir, { recursive: true, force: true }));

// Runs atlas with the process's data segment capped (RLIMIT_DATA: heap and private
// mappings, not the checkpoint's read-only shared mapping): a load that went on to copy
// weights would fail allocating them, not pass.
// AddressSanitizer maps terabytes of shadow memory at start, which no such cap allows: a
// sanitizer build runs uncapped, and the release build's run is the one that checks the cap.
const SANITIZED = readFileSync(BIN).includes('__asan_init');

function atlasCapped(args, dataKiB = 1000000) {
  const t0 = Date.now();
  const quoted = args.map((a) => `'${a.replace(/'/g, "'\\''")}'`).join(' ');
  const cap = SANITIZED ? '' : `ulimit -d ${dataKiB} && `;
  const r = spawnSync('sh', ['-c', `${cap}exec '${BIN}' ${quoted}`],
    { encoding: 'utf8', timeout: 60000 });
  return { ...r, ms: Date.now() - t0 };
}

const GIB = 1024 ** 3;

test('the sparse checkpoint is larger than this machine and takes no disk', () => {
  assert.ok(big.bytes > os.totalmem() && big.bytes > 60 * GIB, `${big.bytes} bytes of tensors, ${os.totalmem()} of RAM`);
  assert.ok(big.diskBytes < 1024 * 1024, `${big.diskBytes} bytes on disk`);
});

test('atlas info reads headers only: parameters, dtype, bytes, and that it does not fit', () => {
  const r = atlasCapped(['info', '-m', big.dir, '--device', 'cpu'], 200000);
  assert.equal(r.status, 0, r.stderr);
  assert.ok(r.ms < 5000, `${r.ms} ms`);
  assert.match(r.stdout, /^architecture:  LlamaForCausalLM$/m);
  assert.match(r.stdout, new RegExp(`^parameters:    ${big.params} \\(${(big.params / 1e6).toFixed(1)} M\\)$`, 'm'));
  assert.match(r.stdout, new RegExp(`^weights:       BF16, ${(big.bytes / 1048576).toFixed(1)} MiB$`, 'm'));
  assert.match(r.stdout, new RegExp(`^layers:        ${big.config.num_hidden_layers}$`, 'm'));
  assert.match(r.stdout, /^tokenizer:     tokenizer\.json$/m);
  assert.match(r.stdout, /^backend:       cpu \(requested\)$/m);
  const m = r.stdout.match(/^memory:        needs (\d+\.\d+) GiB of (\d+\.\d+) GiB available \((.+)\): does not fit, a load is refused \(--no-memory-check loads anyway\)$/m);
  assert.ok(m, r.stdout);
  assert.ok(Number(m[1]) > 64 && Number(m[2]) < Number(m[1]), m[0]);

  // and a model that fits says so
  const small = atlasCapped(['info', '--device', 'cpu'], 200000);
  assert.equal(small.status, 0, small.stderr);
  assert.match(small.stdout, /^memory:        needs 0\.\d\d GiB of \d+\.\d\d GiB available \(.+\)$/m);
  assert.match(small.stdout, /^parameters:    6951168 /m);
});

test('atlas run refuses the checkpoint with both figures before reading a weight', () => {
  const r = atlasCapped(['run', '-m', big.dir, '--device', 'cpu', '-p', 'hi', '-n', '1']);
  assert.equal(r.status, 1, r.stderr);
  assert.ok(r.ms < 5000, `${r.ms} ms`);
  const m = r.stderr.match(/not enough memory: the weights and the KV cache need (\d+\.\d+) GiB \(weights (\d+\.\d+), KV cache (\d+\.\d+)\) on the CPU, and (\d+\.\d+) GiB is available \((.+?)\); nothing was read\. .*--no-memory-check/);
  assert.ok(m, r.stderr);
  assert.ok(Math.abs(Number(m[2]) - big.bytes / GIB) < 0.01, `${m[2]} GiB of weights`);
  assert.ok(Number(m[1]) > Number(m[4]), m[0]);
  assert.match(m[5], /MemAvailable|cgroup/);
  assert.doesNotMatch(r.stderr, /binding|reading weight/);

  // forced: the load goes on to the weights, which the capped data segment cannot hold
  // (uncapped, a sanitizer build would try to fill the machine's memory)
  if (SANITIZED) return;
  const f = atlasCapped(['run', '-m', big.dir, '--device', 'cpu', '-p', 'hi', '-n', '1', '--no-memory-check']);
  assert.equal(f.status, 1, f.stderr);
  assert.doesNotMatch(f.stderr, /not enough memory/);
  assert.match(f.stderr, /out of memory|allocating/);
});

// A port some other program holds.
async function takenPort() {
  const holder = net.createServer();
  await new Promise((resolve) => holder.listen(0, '127.0.0.1', resolve));
  return { holder, port: holder.address().port };
}

test('a port in use fails in under a second, before any model is checked or loaded', async () => {
  const { holder, port } = await takenPort();
  try {
    const t0 = Date.now();
    const r = spawnSync(BIN, ['serve', '--port', String(port), '--model', DEFAULT, '--model', `big=${big.dir}`],
      { encoding: 'utf8', timeout: 30000 });
    const ms = Date.now() - t0;
    assert.equal(r.status, 1, r.stderr);
    assert.ok(ms < 1000, `${ms} ms`);
    assert.match(r.stderr, new RegExp(`^atlas serve: listening on 127\\.0\\.0\\.1 port ${port} failed: binding 127\\.0\\.0\\.1:${port}: Address already in use`, 'm'));
    assert.doesNotMatch(r.stderr, /loaded|model default|model big|not enough memory/);
  } finally {
    holder.close();
  }
});

test('a host that does not resolve fails at once', () => {
  const t0 = Date.now();
  const r = spawnSync(BIN, ['serve', '--port', '0', '--host', 'no-such-host.invalid'], { encoding: 'utf8', timeout: 30000 });
  assert.equal(r.status, 1, r.stderr);
  assert.ok(Date.now() - t0 < 5000);
  assert.match(r.stderr, /host 'no-such-host\.invalid': cannot resolve it: /);
  assert.doesNotMatch(r.stderr, /loaded/);
});

test('--host localhost is resolved and served', async () => {
  const srv = await startServer(['--host', 'localhost']);
  try {
    assert.match(srv.log(), new RegExp(`listening on http://(127\\.0\\.0\\.1|\\[::1\\]):${srv.port} \\(localhost\\)$`, 'm'));
    const health = await fetch(`http://localhost:${srv.port}/health`);
    assert.equal(health.status, 200);
    const client = srv.client({ baseURL: `http://localhost:${srv.port}/v1` });
    const r = await client.chat.completions.create({ model: 'default', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.ok(r.choices[0].message.content.length >= 0 && r.usage.completion_tokens > 0);
  } finally {
    const r = await srv.stop();
    assert.equal(r.code, 0, srv.log());
  }
});

// tests/server/lib.mjs — starting `atlas serve` on a free port and talking to it: with the
// official OpenAI SDK, with fetch, and with raw sockets for what no well-behaved client sends.
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import OpenAI from 'openai';

export const BIN = process.env.ATLAS_BIN;
export const DATA = process.env.ATLAS_TEST_DATA ||
  path.join(path.dirname(new URL(import.meta.url).pathname), '..', 'data');
export const LLAMA = `llama=${path.join(DATA, 'tiny-llama3')}`;
export const QWEN = `qwen=${path.join(DATA, 'tiny-qwen3')}`;
// the repository's own small model (models/default: a Llama of 8 layers of 256, vocabulary 4,096)
export const DEFAULT = `default=${path.join(path.dirname(new URL(import.meta.url).pathname), '..', '..', 'models', 'default')}`;

// Starts `atlas serve --port 0 ...args` and resolves once it prints the port it listens on.
// shellWords, when given, are added through sh -c: the only way to hand the server an
// argument that is not UTF-8 (`"$(printf 'x\\377')"`).
export async function startServer(args, { timeoutMs = 30000, shellWords = '' } = {}) {
  if (!BIN) throw new Error('ATLAS_BIN is not set (the path of the atlas binary)');
  const child = shellWords
    ? spawn('sh', ['-c', `exec "$0" serve --port 0 "$@" ${shellWords}`, BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn(BIN, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in time:\n${log}`)), timeoutMs);
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^\s]*:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
  child.stdout.removeAllListeners('data');
  child.stderr.removeAllListeners('data');
  child.removeAllListeners('exit');
  child.stdout.on('data', (d) => { log += d.toString(); });
  child.stderr.on('data', (d) => { log += d.toString(); });
  const exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve({ code, sig })));
  const base = `http://127.0.0.1:${port}`;
  return {
    child, port, base, exited,
    log: () => log,
    client: (opts = {}) => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000, ...opts }),
    rssKiB: () => Number(readFileSync(`/proc/${child.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]),
    // SIGTERM, then the process must leave cleanly by itself.
    async stop() {
      if (child.exitCode !== null) return { code: child.exitCode };
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 15000);
      const r = await exited;
      clearTimeout(t);
      return r;
    },
  };
}

export async function postJSON(base, route, body, headers = {}) {
  const res = await fetch(base + route, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* left null: the caller checks */ }
  return { status: res.status, headers: res.headers, json, text };
}

export async function getJSON(base, route, headers = {}) {
  const res = await fetch(base + route, { headers });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}

// Writes raw bytes on a fresh connection and collects what comes back until the server
// closes it or timeoutMs passes.  Resolves {data, closed, ms}.
export function rawExchange(port, chunks, { timeoutMs = 5000, endAfter = false, delayMs = 0 } = {}) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const sock = net.connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    let done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ data: data.toString('latin1'), closed, ms: Date.now() - t0 });
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    sock.on('data', (d) => { data = Buffer.concat([data, d]); });
    sock.on('close', () => finish(true));
    sock.on('error', () => finish(true));
    sock.on('connect', async () => {
      for (const c of chunks) {
        if (!sock.writable) break;
        sock.write(c);
        if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      }
      if (endAfter) sock.end();
    });
  });
}

export function statusOf(raw) {
  const m = raw.match(/^HTTP\/1\.[01] (\d{3})/);
  return m ? Number(m[1]) : 0;
}

// Greedy (temperature 0) chat request body.
export function greedy(model, content, extra = {}) {
  return { model, messages: [{ role: 'user', content }], temperature: 0, max_tokens: 12, ...extra };
}

// What /proc says of a process: resident memory (KiB), open descriptors, threads; null when
// it is gone.
export function procStats(pid) {
  try {
    const st = readFileSync(`/proc/${pid}/status`, 'utf8');
    return { rssKiB: Number(st.match(/VmRSS:\s+(\d+)/)[1]), threads: Number(st.match(/Threads:\s+(\d+)/)[1]),
      fds: readdirSync(`/proc/${pid}/fd`).length };
  } catch { return null; }
}

// Whether the binary was built with AddressSanitizer (its quarantine holds freed memory, so
// resident memory says nothing of leaks there; LeakSanitizer checks them at exit instead).
export function isSanitized(bin = BIN) {
  try { return readFileSync(bin).includes('__asan_init'); } catch { return false; }
}

// Polls fn until it returns a truthy value (resolved with it) or timeoutMs passes (resolves
// the last value).
export async function waitFor(fn, { timeoutMs = 10000, everyMs = 100 } = {}) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v || Date.now() - t0 > timeoutMs) return v;
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

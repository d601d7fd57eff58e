// HTTPS: --ssl-certfile/--ssl-keyfile serve TLS 1.2 and 1.3 (a self-signed certificate made
// here with the openssl CLI), refuse TLS 1.1, stream over TLS, and refuse half a pair.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { BIN } from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'atlas-tls-'));
const cert = path.join(dir, 'cert.pem');
const key = path.join(dir, 'key.pem');
let child, port, log = '';

before(async () => {
  const r = spawnSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key,
    '-out', cert, '-days', '1', '-subj', '/CN=localhost'], { encoding: 'utf8' });
  assert.equal(r.status, 0, `openssl (scripts/setup.sh installs it): ${r.error || r.stderr}`);
  child = spawn(BIN, ['serve', '--port', '0', '--ssl-certfile', cert, '--ssl-keyfile', key],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no start:\n${log}`)), 30000);
    const on = (d) => {
      log += d;
      const m = log.match(/listening on https:\/\/[^\s]*:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    };
    child.stdout.on('data', on);
    child.stderr.on('data', on);
    child.on('exit', (c) => { clearTimeout(timer); reject(new Error(`exited ${c}:\n${log}`)); });
  });
});
after(async () => {
  child.removeAllListeners('exit');
  const exited = new Promise((r) => child.on('exit', (code) => r(code)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0, log);
  rmSync(dir, { recursive: true, force: true });
});

function request(route, { method = 'GET', body, ...tlsOpts } = {}) {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port, path: route, method, rejectUnauthorized: false,
      headers: body ? { 'content-type': 'application/json' } : {}, ...tlsOpts }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, text, proto: res.socket.getProtocol?.() }));
    });
    req.on('error', reject);
    if (body) req.write(JSON.stringify(body));
    req.end();
  });
}

test('HTTPS answers over TLS 1.3 and 1.2', async () => {
  const r13 = await request('/health', { agent: false });
  assert.equal(r13.status, 200, r13.text);
  const r12 = await request('/health', { agent: false, maxVersion: 'TLSv1.2' });
  assert.equal(r12.status, 200, r12.text);
  // the certificate served is ours
  const peer = await new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false }, () => {
      resolve({ cert: s.getPeerCertificate(), proto: s.getProtocol() });
      s.end();
    });
    s.on('error', reject);
  });
  assert.equal(peer.cert.subject.CN, 'localhost');
  assert.equal(peer.proto, 'TLSv1.3');
});

test('TLS 1.1 is refused', async () => {
  const err = await new Promise((resolve) => {
    const s = tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false, minVersion: 'TLSv1',
      maxVersion: 'TLSv1.1', ciphers: 'DEFAULT:@SECLEVEL=0' }, () => { s.end(); resolve(null); });
    s.on('error', resolve);
  });
  assert.ok(err, 'a TLS 1.1 handshake succeeded');
  // the server still answers afterwards
  assert.equal((await request('/health', { agent: false })).status, 200);
});

test('a streamed completion over HTTPS', async () => {
  const r = await request('/v1/completions', { method: 'POST', agent: false,
    body: { prompt: 'hi', max_tokens: 3, stream: true, temperature: 0, ignore_eos: true } });
  assert.equal(r.status, 200, r.text);
  assert.ok(r.text.endsWith('data: [DONE]\n\n'), r.text.slice(-200));
  assert.equal(r.text.split('data: {').length - 1 >= 3, true, r.text);
});

test('plain HTTP on the HTTPS port gets no answer and does not hurt the server', async () => {
  const net = await import('node:net');
  const got = await new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => s.write('GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n'));
    let data = '';
    s.on('data', (d) => { data += d.toString('latin1'); });
    s.on('close', () => resolve(data));
    s.on('error', () => resolve(data));
    setTimeout(() => { s.destroy(); resolve(data); }, 3000);
  });
  assert.doesNotMatch(got, /^HTTP\/1\.1 200/);
  assert.equal((await request('/health', { agent: false })).status, 200);
});

test('a certificate without its key is refused at start', () => {
  const r = spawnSync(BIN, ['serve', '--port', '0', '--ssl-certfile', cert], { encoding: 'utf8', timeout: 30000 });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--ssl-keyfile/);
  const bad = spawnSync(BIN, ['serve', '--port', '0', '--ssl-certfile', cert, '--ssl-keyfile', cert],
    { encoding: 'utf8', timeout: 30000 });
  assert.notEqual(bad.status, 0, bad.stderr);
  assert.match(bad.stderr, /HTTPS|key/);
});

// Cross-origin requests from browser pages (CORS), over real sockets: the default lets
// pages served from this machine (localhost, 127.0.0.1, [::1], any port) call the API, as
// Ollama does, and nothing else; --cors-origin widens or narrows it. Preflights need no
// API key (browsers send none), the requests themselves still do.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, rawExchange, statusOf, LLAMA } from './lib.mjs';

const servers = {};
before(async () => {
  servers.local = await startServer(['--model', LLAMA, '--api-key', 'k']);
  servers.any = await startServer(['--model', LLAMA, '--cors-origin', '*']);
  servers.none = await startServer(['--model', LLAMA, '--cors-origin', 'none']);
  servers.list = await startServer(['--model', LLAMA, '--cors-origin', 'https://app.example,http://10.0.0.5:3000']);
  servers.hosts = await startServer(['--model', LLAMA, '--allowed-hosts', 'atlas.lan, box']);
});
after(async () => {
  for (const s of Object.values(servers)) {
    const r = await s.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${s.log()}`);
  }
});

const preflight = (s, origin, path = '/v1/chat/completions') => fetch(s.base + path, {
  method: 'OPTIONS',
  headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization,content-type' },
});

test('default: local pages only', async () => {
  const s = servers.local;
  for (const origin of ['http://localhost:3000', 'http://127.0.0.1', 'https://[::1]:8443', 'http://localhost']) {
    const r = await preflight(s, origin);
    assert.equal(r.status, 204, origin);
    assert.equal(r.headers.get('access-control-allow-origin'), origin);
    assert.match(r.headers.get('access-control-allow-methods'), /POST/);
    assert.equal(r.headers.get('access-control-allow-headers'), 'authorization,content-type');
  }
  for (const origin of ['https://evil.example', 'http://localhost.evil.example', 'http://127.0.0.1.nip.io',
    'http://localhost:', 'http://localhost:80x', 'file://', 'null']) {
    const r = await preflight(s, origin);
    assert.equal(r.status, 403, origin);
    assert.equal(r.headers.get('access-control-allow-origin'), null, origin);
    assert.equal((await r.json()).error.code, 'origin_not_allowed');
  }
  // the request itself: key still required, and the header only for an allowed origin
  let r = await fetch(s.base + '/v1/models', { headers: { origin: 'http://localhost:5173', authorization: 'Bearer k' } });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('access-control-allow-origin'), 'http://localhost:5173');
  assert.equal(r.headers.get('vary'), 'Origin');
  r = await fetch(s.base + '/v1/models', { headers: { origin: 'http://localhost:5173' } });
  assert.equal(r.status, 401);
  r = await fetch(s.base + '/v1/models', { headers: { origin: 'https://evil.example', authorization: 'Bearer k' } });
  assert.equal(r.headers.get('access-control-allow-origin'), null);
  // a preflight for a path that does not exist is a 404, not a 204
  assert.equal((await preflight(s, 'http://localhost:3000', '/nope')).status, 404);
});

test('--cors-origin *, none and a list', async () => {
  let r = await preflight(servers.any, 'https://anything.example');
  assert.equal(r.status, 204);
  assert.equal(r.headers.get('access-control-allow-origin'), '*');
  r = await preflight(servers.none, 'http://localhost:3000');
  assert.equal(r.status, 403);
  r = await fetch(servers.none.base + '/health', { headers: { origin: 'http://localhost:3000' } });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('access-control-allow-origin'), null);
  for (const [origin, ok] of [['https://app.example', true], ['http://10.0.0.5:3000', true],
    ['https://app.example.evil', false], ['http://localhost:3000', false], ['https://app.exampl', false]]) {
    r = await preflight(servers.list, origin);
    assert.equal(r.status, ok ? 204 : 403, origin);
  }
});

// A "simple" cross-origin request needs no preflight: a page elsewhere can post text/plain.
test('a simple cross-origin POST is refused, whatever its content type', async () => {
  const s = servers.local;
  const body = JSON.stringify({ model: 'llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
  for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'application/json']) {
    const r = await fetch(s.base + '/v1/models/llama/load', {
      method: 'POST', headers: { origin: 'https://evil.example', 'content-type': type, authorization: 'Bearer k' }, body: '{}',
    });
    assert.equal(r.status, 403, type);
    assert.equal((await r.json()).error.code, 'origin_not_allowed');
  }
  const ok = await fetch(s.base + '/v1/chat/completions', {
    method: 'POST', headers: { origin: 'http://localhost:3000', 'content-type': 'text/plain', authorization: 'Bearer k' }, body,
  });
  assert.equal(ok.status, 200);
});

// DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 sends its own Host.
test('Host allow-list: loopback names and the bound address, more with --allowed-hosts', async () => {
  const get = async (s, host) => statusOf((await rawExchange(s.port, [`GET /v1/models HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n`])).data);
  for (const host of ['localhost', `localhost:${servers.local.port}`, '127.0.0.1', `127.0.0.1:${servers.local.port}`, '[::1]:8080', 'LOCALHOST'])
    assert.equal(await get(servers.local, host), 200, host);
  for (const host of ['127.255.0.1', '[0:0:0:0:0:0:0:1]:80'])
    assert.equal(await get(servers.local, host), 200, host);
  // a DNS name that merely begins like a loopback address is another site's
  for (const host of ['evil.example', 'evil.example:8080', 'localhost.evil.example', '[::1', 'atlas.lan',
    '127.0.0.1.evil.example', `127.0.0.1.evil.example:${servers.local.port}`, '127.attacker.example', '127.1.evil.example'])
    assert.equal(await get(servers.local, host), 403, host);
  for (const host of ['atlas.lan', 'box:9000', 'localhost'])
    assert.equal(await get(servers.hosts, host), 200, host);
  assert.equal(await get(servers.hosts, 'evil.example'), 403);
});

// HTTP framing on raw sockets: one response per request, a JSON 400 for an ambiguous body
// length, a JSON 413 for a body over --max-body (declared or chunked) that arrives before
// the connection closes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, rawExchange, statusOf } from './lib.mjs';

let srv;
before(async () => {
  srv = await startServer(['--max-body', '64K']);
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
});

const statusLines = (raw) => (raw.match(/HTTP\/1\.[01] \d{3}/g) || []).length;

// The JSON body of a raw response, checked to be in the API's error shape.
function errorBody(raw) {
  const body = raw.slice(raw.indexOf('\r\n\r\n') + 4);
  const j = JSON.parse(body);
  assert.equal(typeof j.error.message, 'string', body);
  assert.equal(typeof j.error.type, 'string', body);
  return j.error;
}

const head = (extra) => `POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n${extra}\r\n`;

test('duplicate Content-Length: one JSON 400', async () => {
  for (const cl of ['Content-Length: 7\r\nContent-Length: 7\r\n', 'Content-Length: 5\r\nContent-Length: 7\r\n',
    'Content-Length: 7\r\nContent-Length: -1\r\n']) {
    const r = await rawExchange(srv.port, [head(cl) + '{"a":1}']);
    assert.equal(statusOf(r.data), 400, r.data);
    assert.equal(statusLines(r.data), 1, r.data);
    assert.match(errorBody(r.data).message, /Content-Length/);
  }
});

test('Content-Length with Transfer-Encoding, or an unknown coding: JSON 400', async () => {
  const both = await rawExchange(srv.port, [head('Content-Length: 5\r\nTransfer-Encoding: chunked\r\n') + '0\r\n\r\n']);
  assert.equal(statusOf(both.data), 400, both.data);
  assert.equal(statusLines(both.data), 1, both.data);
  assert.match(errorBody(both.data).message, /both/);
  const gz = await rawExchange(srv.port, [head('Transfer-Encoding: gzip, chunked\r\n') + '0\r\n\r\n']);
  assert.equal(statusOf(gz.data), 400, gz.data);
  assert.match(errorBody(gz.data).message, /Transfer-Encoding/);
});

test('a negative Content-Length is refused with 400 and the connection closed', async () => {
  // libmicrohttpd answers this one itself, before atlas sees the request (docs/SERVER.md, "HTTP framing")
  const r = await rawExchange(srv.port, [head('Content-Length: -1\r\n') + '{}']);
  assert.equal(statusOf(r.data), 400, r.data);
  assert.ok(r.closed, 'connection left open');
});

// Sends a chunked body of `total` bytes in 64 KiB chunks while reading; resolves with what
// came back and whether it came before the server closed.
function chunkedUpload(total) {
  return new Promise((resolve) => {
    const sock = net.connect(srv.port, '127.0.0.1');
    let data = '';
    let sent = 0;
    const done = (why) => { sock.destroy(); resolve({ data, sent, why }); };
    sock.on('data', (d) => { data += d.toString('latin1'); });
    sock.on('close', () => done('closed'));
    sock.on('error', () => done('error'));
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    const frame = Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]);
    sock.on('connect', () => {
      sock.write(head('Transfer-Encoding: chunked\r\n'));
      const pump = () => {
        while (sent < total) {
          sent += chunk.length;
          if (!sock.write(frame)) return sock.once('drain', pump);
        }
        sock.write('0\r\n\r\n');
      };
      pump();
    });
  });
}

test('an 80 MiB chunked body over --max-body: a JSON 413 before the close', async () => {
  const r = await chunkedUpload(80 << 20);
  assert.equal(statusOf(r.data), 413, `${r.why} after ${r.sent} bytes: ${r.data.slice(0, 200)}`);
  assert.equal(statusLines(r.data), 1, r.data);
  assert.equal(errorBody(r.data).code, 'request_too_large');
});

test('a declared body over --max-body: a JSON 413, read or refused at once', async () => {
  const body = 'x'.repeat(100 * 1024);
  const r = await rawExchange(srv.port, [head(`Content-Length: ${body.length}\r\n`) + body]);
  assert.equal(statusOf(r.data), 413, r.data);
  assert.equal(errorBody(r.data).code, 'request_too_large');
  // 1 GiB declared, nothing sent: refused at once
  const huge = await rawExchange(srv.port, [head('Content-Length: 1073741824\r\n')], { timeoutMs: 3000 });
  assert.equal(statusOf(huge.data), 413, huge.data);
  assert.ok(huge.ms < 2000, `${huge.ms} ms`);
  // Expect: 100-continue: refused before the client sends the body
  const cont = await rawExchange(srv.port, [head(`Content-Length: ${body.length}\r\nExpect: 100-continue\r\n`)], { timeoutMs: 3000 });
  assert.equal(statusOf(cont.data), 413, cont.data);
  assert.doesNotMatch(cont.data, /100 Continue/);
});

test('pipelined requests: one response each, in order', async () => {
  const one = 'GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n';
  const bad = 'GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n';
  const tok = head('Content-Length: 13\r\n') + '{"prompt":"a"}'.slice(0, 13);
  const r = await rawExchange(srv.port, [one + bad + one + tok], { timeoutMs: 1500 });
  const statuses = [...r.data.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
  assert.deepEqual(statuses.slice(0, 3), [200, 404, 200], r.data);
  assert.equal(statuses.length, 4, r.data);
  // the 404 is JSON in the API's shape too
  assert.match(r.data, /"type":"not_found_error"/);
});

test('a client that half-closes after its request still gets its answer', async () => {
  const r = await rawExchange(srv.port, ['GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n'],
    { endAfter: true, timeoutMs: 3000 });
  assert.equal(statusOf(r.data), 200, r.data);
  assert.ok(r.closed);
});

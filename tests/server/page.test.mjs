// The chat page at /, in Debian's chromium driven by puppeteer-core: it loads with its
// Content-Security-Policy, lists the models with their state, streams an answer from the
// default model, stops one midway (the server frees the sequence and serves the next),
// switches models with the system prompt and sampling settings, keeps conversations in
// localStorage, and shows a model answer that holds markup as text. Without Accept:
// text/html, / is still Ollama's answer; with --api-key the page loads without the key and
// asks for it. The server refuses other origins (--cors-origin none) yet takes the page's own.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import puppeteer from 'puppeteer-core';
import { startServer, postJSON, getJSON, waitFor, DEFAULT, LLAMA } from './lib.mjs';

const CHROMIUM = '/usr/bin/chromium'; // tests/server/run.sh skips when it is absent
const KEY = 'sk-page-test-51c2';

let srv, keyed, browser;
before(async () => {
  [srv, keyed] = await Promise.all([
    startServer(['--model', DEFAULT, '--model', LLAMA, '--cors-origin', 'none']),
    startServer(['--model', DEFAULT, '--api-key', KEY]),
  ]);
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing`);
  browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'] });
});
after(async () => {
  await browser?.close();
  for (const s of [srv, keyed]) {
    const r = await s?.stop();
    assert.equal(r?.code, 0, `server exit ${JSON.stringify(r)}\n${s?.log()}`);
  }
});

const HTML = { accept: 'text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8' };

test('/ is the page for HTML clients and Ollama\'s answer for the others', async () => {
  for (const headers of [{}, { accept: '*/*' }, { accept: 'application/json' }, { accept: 'text/html;q=0' }]) {
    const r = await fetch(srv.base + '/', { headers });
    assert.equal(r.status, 200);
    assert.equal(await r.text(), 'Ollama is running', JSON.stringify(headers));
  }
  const page = await fetch(srv.base + '/', { headers: HTML });
  assert.equal(page.status, 200);
  assert.equal(page.headers.get('content-type'), 'text/html; charset=utf-8');
  const csp = page.headers.get('content-security-policy');
  for (const rule of ["default-src 'self'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
    "img-src 'self' data:", "frame-ancestors 'none'"])
    assert.ok(csp.includes(rule), `${rule} in ${csp}`);
  assert.ok(!/unsafe-inline|unsafe-eval/.test(csp), csp);
  assert.equal(page.headers.get('x-content-type-options'), 'nosniff');
  assert.match(page.headers.get('vary'), /Accept/);
  const html = await page.text();
  assert.match(html, /<script src="\/ui\/chat\.js" defer><\/script>/);
  assert.ok(!/<script>|\son\w+=/.test(html), 'no inline script or handler');
  for (const [file, type] of [['chat.js', 'text/javascript; charset=utf-8'], ['chat.css', 'text/css; charset=utf-8']]) {
    const r = await fetch(`${srv.base}/ui/${file}`);
    assert.equal(r.status, 200, file);
    assert.equal(r.headers.get('content-type'), type);
    assert.ok((await r.text()).length > 500, file);
    const etag = r.headers.get('etag');
    assert.match(etag, /^"[0-9a-f]{20}"$/);
    const again = await fetch(`${srv.base}/ui/${file}`, { headers: { 'if-none-match': etag } });
    assert.equal(again.status, 304, file);
    assert.equal((await fetch(`${srv.base}/ui/${file}`, { headers: { 'if-none-match': '"other"' } })).status, 200);
  }
  const missing = await getJSON(srv.base, '/ui/nope.js');
  assert.equal(missing.status, 404);
  assert.match(missing.json.error.message, /no such file/);
});

test('with --api-key the page loads without the key and the API wants it', async () => {
  const page = await fetch(keyed.base + '/', { headers: HTML });
  assert.equal(page.status, 200);
  assert.match(await page.text(), /<title>atlas<\/title>/);
  assert.equal((await fetch(keyed.base + '/ui/chat.js')).status, 200);
  assert.equal((await fetch(keyed.base + '/')).status, 200); // Ollama's probe, keyless too
  assert.equal((await getJSON(keyed.base, '/v1/models')).status, 401);
  assert.equal((await getJSON(keyed.base, '/v1/models', { authorization: `Bearer ${KEY}` })).status, 200);
});

test('the page\'s own origin may post where other origins may not', async () => {
  const body = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
  const own = await postJSON(srv.base, '/v1/chat/completions', body, { origin: srv.base });
  assert.equal(own.status, 200, own.text);
  for (const origin of ['http://evil.example', `https://127.0.0.1:${srv.port}`, `http://127.0.0.1:${srv.port + 1}`,
    `http://localhost:${srv.port}`]) {
    const r = await postJSON(srv.base, '/v1/chat/completions', body, { origin });
    assert.equal(r.status, 403, origin);
  }
});

// The text of the last answer on the page, and what the page stored of it.
const lastAnswer = (page) => page.evaluate(() => {
  const views = document.querySelectorAll('#messages .msg.assistant');
  const v = views[views.length - 1];
  const convs = JSON.parse(localStorage.getItem('atlas.conversations'));
  const cur = convs.find((c) => c.id === localStorage.getItem('atlas.current'));
  return { text: v.querySelector('.content').textContent, note: v.querySelector('.note').textContent,
    error: v.querySelector('.error').textContent, who: v.querySelector('.who').textContent,
    stored: cur.messages[cur.messages.length - 1] };
});

const chatLines = () => srv.log().split('\n').filter((l) => /POST \/v1\/chat\/completions .*tokens_out=/.test(l));
const ready = (page) => page.waitForFunction(() => document.body.dataset.state === 'ready', { timeout: 60000 });

async function ask(page, text) {
  await page.type('#input', text);
  await page.click('#send'); // the page is busy once the click is handled
}

const setField = (page, id, value) => page.evaluate((id, value) => {
  const e = document.getElementById(id);
  e.value = value;
  e.dispatchEvent(new Event('input'));
}, id, value);

test('in chromium: stream, stop, switch models, conversations, markup as text', async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  const posted = [];
  page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) posted.push(JSON.parse(r.postData())); });
  const res = await page.goto(srv.base + '/');
  assert.match(res.headers()['content-security-policy'], /script-src 'self'/);
  await ready(page);
  const options = await page.$$eval('#model option', (os) => os.map((o) => [o.value, o.textContent]));
  assert.deepEqual(options.map((o) => o[0]), ['default', 'llama']);
  for (const [id, label] of options) assert.match(label, new RegExp(`^${id} \\((resident|loading|unloaded|draining|failed)\\)$`));
  assert.equal(await page.$eval('#model', (s) => s.value), 'default');
  await page.click('#settings-toggle');
  await setField(page, 'temperature', '0');
  await setField(page, 'max_tokens', '300');

  // an answer from the default model, seen growing on the page as it streams
  await page.evaluate(() => {
    window.seen = [];
    new MutationObserver(() => {
      const c = document.querySelector('#messages .msg.assistant:last-child .content');
      const busy = document.body.dataset.state === 'busy';
      if (c && busy && c.textContent.length !== window.seen[window.seen.length - 1]) window.seen.push(c.textContent.length);
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  await ask(page, 'Hello');
  await ready(page);
  const seen = (await page.evaluate(() => window.seen)).filter((n) => n > 0);
  assert.ok(seen.length >= 2 && seen[seen.length - 1] > seen[0], `the answer did not grow in steps while streaming: ${seen}`);
  const first = await lastAnswer(page);
  assert.equal(first.error, '');
  const body0 = posted[0];
  assert.equal(body0.model, 'default');
  assert.equal(body0.stream, true);
  assert.equal(body0.temperature, 0);
  assert.equal(body0.max_tokens, 300);
  const direct = await srv.client().chat.completions.create({ ...body0, stream: false });
  assert.equal(first.stored.content, direct.choices[0].message.content, 'the streamed answer, as stored');
  assert.ok(first.text.length > 0);

  // stop one midway: the request ends, the page is ready, the server frees the sequence
  await setField(page, 'max_tokens', '600');
  const logged = chatLines().length;
  await ask(page, 'Tell me a long story');
  await page.waitForFunction(() => {
    const v = document.querySelector('#messages .msg.assistant:last-child');
    return v.querySelector('.content').textContent.length > 20 || v.querySelector('.error').textContent;
  });
  assert.equal(await page.$eval('body', (b) => b.dataset.state), 'busy', 'the answer ended before the stop');
  await page.click('#stop');
  await ready(page);
  const stopped = await lastAnswer(page);
  assert.equal(stopped.note, 'stopped');
  assert.equal(stopped.stored.note, 'stopped');
  assert.ok(stopped.stored.content.length > 0);
  const freed = await waitFor(async () => {
    const m = (await getJSON(srv.base, '/v1/models')).json.data.find((x) => x.id === 'default');
    return m.running === 0 && m.waiting === 0;
  });
  assert.ok(freed, 'the stopped request still runs');
  // the stream closed (its access-log line is written then), short of its 600 tokens
  await waitFor(() => chatLines()[logged]);
  const tok = await postJSON(srv.base, '/tokenize', { model: 'default', prompt: stopped.stored.content, add_special_tokens: false });
  assert.ok(tok.json.tokens.length < 550, `the stopped answer ran to ${tok.json.tokens.length} tokens`);

  // switch models: the next request goes to the other one, with the whole conversation and
  // the settings (a system prompt, top_p)
  await page.select('#model', 'llama');
  assert.match(await page.$eval('#model-state', (e) => e.textContent), /^(resident|loading|unloaded|draining|failed)/);
  await setField(page, 'max_tokens', '8');
  await setField(page, 'system', 'Answer in one word.');
  await setField(page, 'top_p', '0.9');
  await ask(page, 'And now?');
  await ready(page);
  const third = await lastAnswer(page);
  assert.equal(third.error, '');
  assert.equal(third.who, 'llama');
  const body2 = posted[2];
  assert.equal(body2.model, 'llama');
  assert.deepEqual(body2.messages.map((m) => m.role), ['system', 'user', 'assistant', 'user', 'assistant', 'user']);
  assert.equal(body2.messages[0].content, 'Answer in one word.');
  assert.equal(body2.messages[4].content, stopped.stored.content);
  assert.equal(body2.top_p, 0.9);
  assert.equal(body2.max_tokens, 8);
  const direct2 = await srv.client().chat.completions.create({ ...body2, stream: false });
  assert.equal(third.stored.content, direct2.choices[0].message.content);

  // a model's answer holding markup, its reasoning too: shown as text, nothing runs
  await page.setRequestInterception(true);
  const evil = 'Look: <img src=x onerror="window.pwned=1"> **<b>bold</b>** `<script>window.pwned=2</script>` ' +
    '[click](javascript:window.pwned=3) [docs](https://example.com/a) <a href="javascript:window.pwned=4">a</a>\n\n' +
    '```html\n<img src=x onerror="window.pwned=5">\n```\n- item <svg onload="window.pwned=6">\n';
  const chunk = (delta) => `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
  const inject = (r) => {
    if (!r.url().endsWith('/v1/chat/completions')) return r.continue();
    return r.respond({ status: 200, contentType: 'text/event-stream', body:
      chunk({ reasoning_content: 'think <img src=y onerror="window.pwned=7">' }) +
      chunk({ content: evil.slice(0, 30) }) + chunk({ content: evil.slice(30) }) + 'data: [DONE]\n\n' });
  };
  page.on('request', inject);
  await page.click('#new-chat');
  await ask(page, 'Show me HTML');
  await ready(page);
  const check = () => page.evaluate(() => {
    const box = document.getElementById('messages');
    const d = box.querySelector('details.reasoning');
    return { tags: [...box.querySelectorAll('img, script, svg, b, iframe')].map((e) => e.tagName),
      hrefs: [...box.querySelectorAll('a')].map((a) => [a.getAttribute('href'), a.rel]),
      text: box.querySelector('.msg.assistant .content').textContent,
      code: box.querySelector('.msg.assistant pre code')?.textContent,
      strong: box.querySelector('.msg.assistant strong')?.textContent,
      reasoning: d && { open: d.open, text: d.querySelector('.text').textContent },
      pwned: window.pwned };
  });
  let shown = await check();
  assert.deepEqual(shown.tags, []);
  assert.deepEqual(shown.hrefs, [['https://example.com/a', 'noopener noreferrer']]);
  assert.ok(shown.text.includes('<img src=x onerror="window.pwned=1">'), shown.text);
  assert.ok(shown.text.includes('<a href="javascript:window.pwned=4">a</a>'), shown.text);
  assert.ok(shown.text.includes('[click](javascript:window.pwned=3)'), shown.text);
  assert.equal(shown.code, '<img src=x onerror="window.pwned=5">');
  assert.equal(shown.strong, '<b>bold</b>');
  assert.deepEqual(shown.reasoning, { open: false, text: 'think <img src=y onerror="window.pwned=7">' });
  assert.equal(shown.pwned, undefined);

  // conversations outlive a reload (localStorage), the markup stays text, one is deleted
  page.off('request', inject);
  await page.setRequestInterception(false);
  await page.reload();
  await ready(page);
  assert.equal(await page.$$eval('#conversations li', (l) => l.length), 2);
  shown = await check();
  assert.deepEqual(shown.tags, []);
  assert.equal(shown.pwned, undefined);
  assert.ok(shown.text.includes('<img src=x onerror="window.pwned=1">'));
  await page.click('#conversations li.current .delete');
  assert.equal(await page.$$eval('#conversations li', (l) => l.length), 1);
  assert.equal(await page.$$eval('#messages .msg', (l) => l.length), 0);
  await page.click('#conversations li .open');
  assert.equal(await page.$$eval('#messages .msg', (l) => l.length), 6);
  assert.deepEqual(errors, []);
  await page.close();
});

test('in chromium with --api-key: the page asks for the key and keeps it in sessionStorage', async () => {
  const page = await browser.newPage();
  await page.goto(keyed.base + '/');
  await page.waitForSelector('#key-form:not([hidden])');
  assert.match(await page.$eval('#status', (e) => e.textContent), /API key/);
  await page.type('#api-key', KEY);
  await page.click('#key-form button');
  await ready(page);
  assert.deepEqual(await page.$$eval('#model option', (os) => os.map((o) => o.value)), ['default']);
  const stored = await page.evaluate(() => ({ session: sessionStorage.getItem('atlas.key'),
    local: JSON.stringify({ ...localStorage }) }));
  assert.equal(stored.session, KEY);
  assert.ok(!stored.local.includes(KEY), 'the key is not in localStorage');
  await page.close();
});

#!/usr/bin/env node
// bench/serve/soak.mjs — a soak of a running `atlas serve` with several models: --streams
// clients stream at once, each request for a model drawn at random (so a server run with
// --max-resident 1 swaps all the time), a share of them hanging up mid-stream at a random
// point, until --swaps swaps happened (atlas_model_swaps_total in /metrics: loads that
// released another model to make room; a server without it counts its loads) or --duration
// seconds passed.
// Every request not hung up on must succeed and its stream be well-formed.  Node 18+, no
// dependencies; tests/server/soak.test.mjs imports soak() (the bounded CPU form in CI) and
// bench/gpu/soak.sh runs it, or its twin soak.py where there is no Node, on the H200.
//
//   node bench/serve/soak.mjs --url http://127.0.0.1:8080 --models a,b,c [--streams 64]
//        [--swaps 200] [--duration 300] [--disconnect 0.15] [--max-tokens 4-32]
//        [--seed 1] [--pid PID] [--api-key KEY] [--json out.json]
//
// Requests: streamed chat or text completions (half each), a short text prompt, max_tokens
// drawn from --max-tokens, half with ignore_eos (then exactly max_tokens tokens and
// finish_reason "length" are required), half greedy and half sampled with a seed, usage
// asked for.  A well-formed stream: HTTP 200, text/event-stream, every event `data: JSON`
// with one id, the object and model asked for, choice index 0, no error; exactly one
// finish_reason ("stop" or "length"), then the usage chunk (completion_tokens within
// max_tokens), then `data: [DONE]` and nothing after it.  A hang-up closes the socket
// before the response, after its headers, or after a random number of events.  Exit status:
// 0 when no request failed and the swap target (if any) was met, else 1.

import http from 'node:http';
import { readFileSync, readdirSync, realpathSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

// mulberry32: a seed gives the same run (soak.py has the same generator).  Not loadgen's
// LCG: its product overflows a double's 53 bits, and some seeds then cycle short.
export function makeRand(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ('the a swap model stream token river stone light night queen soak memory ' +
  'engine cache block page thread socket answer question again more three').split(' ');

// Prometheus text: {name or name{labels}: value}.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const k = line.lastIndexOf(' ');
    out[line.slice(0, k)] = Number(line.slice(k + 1));
  }
  return out;
}

// GET on a connection of its own, closed after (keep-alive sockets would count as the
// server's open descriptors).
export function httpGet(url, path, headers = {}) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.get({ host: u.hostname, port: u.port, path, agent: false,
      headers: { connection: 'close', ...headers } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    req.setTimeout(30000, () => req.destroy(new Error(`GET ${path}: no answer in 30 s`)));
    req.on('error', reject);
  });
}

export async function metrics(url, headers = {}) {
  const r = await httpGet(url, '/metrics', headers);
  if (r.status !== 200) throw new Error(`/metrics: HTTP ${r.status}`);
  return parseMetrics(r.body);
}

// VmRSS, open descriptors and threads of a local process, or null when it is gone.
export function procStats(pid) {
  try {
    const st = readFileSync(`/proc/${pid}/status`, 'utf8');
    return { rssKiB: Number(st.match(/VmRSS:\s+(\d+)/)[1]), threads: Number(st.match(/Threads:\s+(\d+)/)[1]),
      fds: readdirSync(`/proc/${pid}/fd`).length };
  } catch { return null; }
}

// Swaps so far: loads that released another model (under --max-resident auto a load into free
// room is no swap), or all loads on a server that does not count swaps.
const swapsOf = (m) => ('atlas_model_swaps_total' in m ? m.atlas_model_swaps_total : m.atlas_model_loads_total);
const finished = (m, reason) => m[`atlas_requests_finished_total{reason="${reason}"}`] || 0;
const http5xx = (m) => Object.entries(m).filter(([k]) => k.startsWith('atlas_http_requests_total{') &&
  k.includes('code="5xx"')).reduce((a, [, v]) => a + v, 0);

// Checks one stream's events; returns null when well-formed, else what is wrong.
function checkStream(spec, events, status, ctype) {
  if (status !== 200) return `HTTP ${status}: ${events.join('').slice(0, 300)}`;
  if (!/^text\/event-stream/.test(ctype || '')) return `content-type ${ctype}`;
  if (!events.length || events[events.length - 1] !== '[DONE]') return 'the stream did not end with [DONE]';
  if (events.indexOf('[DONE]') !== events.length - 1) return 'events after [DONE]';
  const object = spec.chat ? 'chat.completion.chunk' : 'text_completion';
  let id = null, finish = [], usage = null, usageAt = -1;
  for (let i = 0; i < events.length - 1; i++) {
    let j;
    try { j = JSON.parse(events[i]); } catch { return `event ${i} is not JSON: ${events[i].slice(0, 200)}`; }
    if (j.error) return `error event: ${JSON.stringify(j.error).slice(0, 300)}`;
    if (j.object !== object) return `event ${i}: object ${j.object}`;
    if (j.model !== spec.model) return `event ${i}: model ${j.model}, asked ${spec.model}`;
    if (id === null) id = j.id;
    else if (j.id !== id) return `event ${i}: id ${j.id} after ${id}`;
    if (!Array.isArray(j.choices)) return `event ${i}: no choices`;
    for (const c of j.choices) {
      if (c.index !== 0) return `event ${i}: choice index ${c.index}`;
      if (spec.chat ? typeof c.delta !== 'object' : typeof c.text !== 'string') return `event ${i}: no delta/text`;
      if (c.finish_reason != null) finish.push(c.finish_reason);
    }
    if (j.usage) { usage = j.usage; usageAt = i; }
  }
  if (finish.length !== 1) return `${finish.length} finish_reasons`;
  if (!['stop', 'length'].includes(finish[0])) return `finish_reason ${finish[0]}`;
  if (!usage || usageAt !== events.length - 2) return 'no usage chunk before [DONE]';
  const n = usage.completion_tokens;
  if (!Number.isInteger(n) || n < 1 || n > spec.max_tokens) return `completion_tokens ${n} (max_tokens ${spec.max_tokens})`;
  if (spec.ignore_eos && (n !== spec.max_tokens || finish[0] !== 'length'))
    return `ignore_eos: ${n} tokens, finish_reason ${finish[0]} (max_tokens ${spec.max_tokens})`;
  return null;
}

// Runs the soak; resolves the report (see the end).  opts: url, models (array), streams,
// swaps (stop once this many swaps happened; 0: none), duration (s, stop then at the
// latest), disconnect (probability), maxTokens [lo, hi], seed, pid (sample its memory),
// apiKey, log (a function, or null), requestTimeoutS.
export async function soak(opts) {
  const o = { streams: 64, swaps: 0, duration: 60, disconnect: 0.15, maxTokens: [4, 32], seed: 1,
    requestTimeoutS: 120, log: console.log, ...opts };
  const url = new URL(o.url.replace(/\/$/, ''));
  const auth = o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {};
  const rand = makeRand(o.seed);
  const pick = (xs) => xs[Math.floor(rand() * xs.length)];
  const agent = new http.Agent({ keepAlive: true, maxSockets: 4096 });
  const log = o.log || (() => {});

  const r = { streams: o.streams, models: o.models, started: 0, completed: 0, failed: 0, failures: [],
    hangups: { before_response: 0, after_headers: 0, mid_stream: 0 }, hangups_outlived: 0,
    tokens: 0, per_model: Object.fromEntries(o.models.map((m) => [m, 0])) };
  const m0 = await metrics(o.url, auth);
  const p0 = o.pid ? procStats(o.pid) : null;
  let rssPeak = p0 ? p0.rssKiB : 0;
  const t0 = performance.now();
  let stop = false, swaps = 0, lastLog = t0, metricsDown = 0;

  function fail(spec, why) {
    r.failed++;
    if (r.failures.length < 20) r.failures.push({ model: spec.model, chat: spec.chat, why });
  }

  // One request; resolves when it ended either way.
  function one(spec) {
    const body = spec.chat
      ? { model: spec.model, messages: [{ role: 'user', content: spec.prompt }] }
      : { model: spec.model, prompt: spec.prompt };
    Object.assign(body, { max_tokens: spec.max_tokens, stream: true, stream_options: { include_usage: true },
      ignore_eos: spec.ignore_eos, temperature: spec.temperature, seed: spec.seed });
    const data = JSON.stringify(body);
    return new Promise((resolve) => {
      let settled = false, buf = '', nEvents = 0, hungUp = false;
      const events = [];
      const done = (why) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (hungUp) r.hangups[spec.hangup]++;
        else if (why) fail(spec, why);
        else {
          r.completed++;
          if (spec.hangup) r.hangups_outlived++;
        }
        resolve();
      };
      const hangUp = () => { hungUp = true; req.destroy(); done(null); };
      const timer = setTimeout(() => { req.destroy(); done(`no end in ${o.requestTimeoutS} s`); }, o.requestTimeoutS * 1000);
      const req = http.request({ host: url.hostname, port: url.port, method: 'POST', agent,
        path: spec.chat ? '/v1/chat/completions' : '/v1/completions',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data), ...auth } }, (res) => {
        if (spec.hangup === 'after_headers') return hangUp();
        res.setEncoding('utf8');
        res.on('data', (d) => {
          if (settled) return;
          buf += d;
          if (res.statusCode !== 200) return;
          let k;
          while ((k = buf.indexOf('\n\n')) >= 0) {
            const ev = buf.slice(0, k);
            buf = buf.slice(k + 2);
            if (!ev.startsWith('data: ')) { events.push(`(not data) ${ev}`); continue; }
            events.push(ev.slice(6));
            nEvents++;
            if (spec.hangup === 'mid_stream' && nEvents >= spec.hangAt && ev !== 'data: [DONE]') return hangUp();
          }
        });
        res.on('end', () => {
          if (settled) return;
          if (res.statusCode !== 200) events.push(buf);
          else if (buf.trim()) events.push(`(unterminated) ${buf}`);
          const why = checkStream(spec, events, res.statusCode, res.headers['content-type']);
          if (!why) {
            const u = events.length >= 2 ? JSON.parse(events[events.length - 2]).usage : null;
            r.tokens += u ? u.completion_tokens : 0;
          }
          done(why);
        });
        res.on('error', (e) => done(`response: ${e.message}`));
        res.on('close', () => done('the connection closed before the response ended'));
      });
      req.on('error', (e) => done(`request: ${e.message}`));
      req.end(data, () => { if (spec.hangup === 'before_response') setImmediate(hangUp); });
    });
  }

  function nextSpec() {
    const max_tokens = o.maxTokens[0] + Math.floor(rand() * (o.maxTokens[1] - o.maxTokens[0] + 1));
    const spec = { model: pick(o.models), chat: rand() < 0.5, max_tokens, ignore_eos: rand() < 0.5,
      temperature: rand() < 0.5 ? 0 : 0.8, seed: Math.floor(rand() * 1e6),
      prompt: Array.from({ length: 3 + Math.floor(rand() * 12) }, () => pick(WORDS)).join(' '), hangup: null };
    if (rand() < o.disconnect) {
      const u = rand();
      spec.hangup = u < 0.15 ? 'before_response' : u < 0.3 ? 'after_headers' : 'mid_stream';
      spec.hangAt = 1 + Math.floor(rand() * (max_tokens + 1)); // events: role, tokens, finish, usage
    }
    return spec;
  }

  async function worker() {
    while (!stop) {
      const spec = nextSpec();
      r.started++;
      r.per_model[spec.model]++;
      await one(spec);
    }
  }

  // The clock: swaps from /metrics, the memory of the server, the stop condition.
  const watcher = (async () => {
    while (!stop) {
      await new Promise((res) => setTimeout(res, 250));
      try {
        const m = await metrics(o.url, auth);
        swaps = swapsOf(m) - swapsOf(m0);
        metricsDown = 0;
      } catch (e) {
        fail({ model: '/metrics', chat: false }, e.message);
        if (++metricsDown >= 3) stop = true; // the server is gone: no point going on
      }
      if (o.pid) { const p = procStats(o.pid); if (p) rssPeak = Math.max(rssPeak, p.rssKiB); }
      const el = (performance.now() - t0) / 1000;
      if ((o.swaps > 0 && swaps >= o.swaps) || el >= o.duration) stop = true;
      if (performance.now() - lastLog > 10000) {
        lastLog = performance.now();
        log(`soak: ${el.toFixed(0)} s, ${swaps} swaps, ${r.started} requests, ${r.completed} completed, ` +
          `${r.failed} failed, ${Object.values(r.hangups).reduce((a, b) => a + b, 0)} hung up`);
      }
    }
  })();
  await Promise.all(Array.from({ length: o.streams }, worker));
  await watcher;
  r.wall_s = (performance.now() - t0) / 1000;
  agent.destroy();
  let m1;
  try { m1 = await metrics(o.url, auth); } catch (e) { fail({ model: '/metrics', chat: false }, e.message); m1 = m0; }
  const d = (k) => (m1[k] || 0) - (m0[k] || 0);
  r.swaps = swapsOf(m1) - swapsOf(m0);
  r.swaps_target_met = !(o.swaps > 0) || r.swaps >= o.swaps;
  const src = (s) => d(`atlas_model_loads_by_source_total{source="${s}"}`);
  r.server = {
    loads: d('atlas_model_loads_total'), unloads: m1.atlas_model_unloads_total - m0.atlas_model_unloads_total,
    load_failures: m1.atlas_model_load_failures_total - m0.atlas_model_load_failures_total,
    submitted: m1.atlas_requests_submitted_total - m0.atlas_requests_submitted_total,
    cancelled: finished(m1, 'cancelled') - finished(m0, 'cancelled'),
    preempted: d('atlas_preemptions_total'), // paused for a swap, or for KV blocks
    errors: finished(m1, 'error') - finished(m0, 'error'),
    rejected: m1.atlas_requests_rejected_total - m0.atlas_requests_rejected_total,
    http_5xx: http5xx(m1) - http5xx(m0),
    swap_s_mean: (m1.atlas_swap_duration_seconds_sum - m0.atlas_swap_duration_seconds_sum) /
      Math.max(1, m1.atlas_swap_duration_seconds_count - m0.atlas_swap_duration_seconds_count),
    // where the loads read the weights from, and the released models' prefix KV in host memory
    loads_by_source: { host: src('host'), page_cache: src('page_cache'), disk: src('disk') },
    kv_host: { saved_blocks: d('atlas_kv_host_saved_blocks_total'), restored_blocks: d('atlas_kv_host_restored_blocks_total'),
      dropped_blocks: d('atlas_kv_host_dropped_blocks_total') },
  };
  if (o.pid) {
    const p1 = procStats(o.pid);
    r.memory = { rss_start_kib: p0 && p0.rssKiB, rss_peak_kib: rssPeak, rss_end_kib: p1 && p1.rssKiB,
      fds_start: p0 && p0.fds, fds_end: p1 && p1.fds, alive: p1 !== null };
  }
  r.hung_up = Object.values(r.hangups).reduce((a, b) => a + b, 0);
  const ls = r.server.loads_by_source;
  log(`soak: ${r.wall_s.toFixed(1)} s, ${r.swaps} swaps (${(r.server.swap_s_mean * 1000).toFixed(1)} ms each), ` +
    `${r.server.loads} loads (${ls.host} from the host tier, ${ls.page_cache} the page cache, ${ls.disk} disk), ` +
    `${r.started} requests: ${r.completed} completed, ${r.failed} failed, ${r.hung_up} hung up ` +
    `(${r.hangups.before_response} before the response, ${r.hangups.after_headers} after the headers, ` +
    `${r.hangups.mid_stream} mid-stream; ${r.hangups_outlived} planned ones ended first), ${r.tokens} tokens; ` +
    `server: ${r.server.cancelled} cancelled, ${r.server.errors} errors, ${r.server.http_5xx} 5xx`);
  for (const f of r.failures) log(`soak: FAILED ${f.model} ${f.chat ? 'chat' : 'completion'}: ${f.why}`);
  return r;
}

// The command line.
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
    return acc;
  }, []));
  if (!args.url || !args.models || args.help) {
    console.error('usage: soak.mjs --url URL --models a,b,c [--streams 64] [--swaps N] [--duration S] ' +
      '[--disconnect 0.15] [--max-tokens 4-32] [--seed 1] [--pid PID] [--api-key KEY] [--json FILE]');
    process.exit(2);
  }
  const r = await soak({
    url: args.url, models: args.models.split(','), streams: Number(args.streams || 64),
    swaps: Number(args.swaps || 0), duration: Number(args.duration || 60),
    disconnect: Number(args.disconnect ?? 0.15), maxTokens: (args['max-tokens'] || '4-32').split('-').map(Number),
    seed: Number(args.seed || 1), pid: args.pid ? Number(args.pid) : undefined, apiKey: args['api-key'],
  });
  r.date = new Date().toISOString();
  r.client = 'bench/serve/soak.mjs';
  if (args.json) writeFileSync(args.json, JSON.stringify(r, null, 2));
  process.exit(r.failed === 0 && r.swaps_target_met ? 0 : 1);
}

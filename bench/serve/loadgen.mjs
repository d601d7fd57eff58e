#!/usr/bin/env node
// bench/serve/loadgen.mjs — drives a running `atlas serve` (or any OpenAI-compatible server)
// and reports throughput, time to first token, inter-token latency and end-to-end latency
// percentiles at each concurrency, and model swap latency.  Node 18+, no dependencies.
//
//   node bench/serve/loadgen.mjs --url http://127.0.0.1:8080 --model A \
//        [--concurrency 1,8,64,256] [--requests N] [--input-len 128] [--output-len 128] \
//        [--swap-model B --swaps 3] [--api-key KEY] [--json out.json]
//
// Each request is a streamed /v1/completions with a prompt of exactly --input-len token ids
// (drawn at random from --id-range) and max_tokens --output-len with ignore_eos, so that
// every request does the same work.  Swap latency: with A resident, the time from sending a
// request for B to B's first token (run the server with --max-resident 1), then back to A.

import http from 'node:http';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
  return acc;
}, []));
if (!args.url || !args.model || args.help) {
  console.error('usage: loadgen.mjs --url URL --model NAME [--concurrency 1,8,64] [--requests N] ' +
    '[--input-len 128] [--output-len 128] [--swap-model B] [--swaps 3] [--api-key KEY] [--json FILE] [--id-range 1000-30000]');
  process.exit(2);
}
const url = args.url.replace(/\/$/, '');
const levels = (args.concurrency || '1,8').split(',').map(Number);
const inLen = Number(args['input-len'] || 128);
const outLen = Number(args['output-len'] || 128);
const [idLo, idHi] = (args['id-range'] || '1000-30000').split('-').map(Number);
const headers = { 'content-type': 'application/json', ...(args['api-key'] ? { authorization: `Bearer ${args['api-key']}` } : {}) };

let seed = Number(args.seed || 1);
const rand = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
const prompt = () => Array.from({ length: inLen }, () => idLo + Math.floor(rand() * (idHi - idLo)));

// One streamed completion: resolves {ttft, itl: [...], e2e, tokens} in seconds.  node:http
// rather than fetch: fetch's body stream coalesces events that arrive close together,
// which would hide the inter-token gaps.
const target = new URL(url);
const agent = new http.Agent({ keepAlive: true, maxSockets: 4096 });
function one(model, maxTokens = outLen) {
  const body = JSON.stringify({ model, prompt: prompt(), max_tokens: maxTokens, ignore_eos: true, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    let buf = '', first = 0, last = 0, tokens = 0, failed = null;
    const itl = [];
    const req = http.request({ host: target.hostname, port: target.port, path: '/v1/completions', method: 'POST', agent,
      headers: { ...headers, 'content-length': Buffer.byteLength(body) } }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (d) => {
        if (res.statusCode !== 200) { buf += d; return; }
        buf += d;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
          const j = JSON.parse(ev.slice(6));
          if (j.error) failed = new Error(j.error.message);
          if (j.usage) tokens = j.usage.completion_tokens;
          if (!j.choices || !j.choices.length || !j.choices[0].text) continue;
          const now = performance.now();
          if (!first) first = now;
          else itl.push((now - last) / 1000);
          last = now;
        }
      });
      res.on('end', () => {
        if (res.statusCode !== 200) return reject(new Error(`HTTP ${res.statusCode}: ${buf}`));
        if (failed) return reject(failed);
        resolve({ ttft: (first - t0) / 1000, itl, e2e: (performance.now() - t0) / 1000, tokens });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const ms = (x) => (x * 1000).toFixed(1);

async function level(conc) {
  const total = Number(args.requests || Math.max(conc * 2, 8));
  let next = 0;
  const results = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: conc }, async () => {
    while (next < total) { next++; results.push(await one(args.model)); }
  }));
  const wall = (performance.now() - t0) / 1000;
  const toks = results.reduce((a, r) => a + r.tokens, 0);
  const itl = results.flatMap((r) => r.itl);
  const ttft = results.map((r) => r.ttft), e2e = results.map((r) => r.e2e);
  return {
    concurrency: conc, requests: total, wall_s: wall, output_tok_s: toks / wall,
    total_tok_s: (toks + total * inLen) / wall, req_s: total / wall,
    ttft_ms: { p50: ms(pct(ttft, 50)), p90: ms(pct(ttft, 90)), p99: ms(pct(ttft, 99)) },
    itl_ms: { p50: ms(pct(itl, 50)), p90: ms(pct(itl, 90)), p99: ms(pct(itl, 99)) },
    e2e_ms: { p50: ms(pct(e2e, 50)), p90: ms(pct(e2e, 90)), p99: ms(pct(e2e, 99)) },
  };
}

async function swaps(a, b, n) {
  await one(a, 1); // A resident
  const out = [];
  for (let i = 0; i < n; i++) {
    const toB = (await one(b, 1)).ttft;
    const toA = (await one(a, 1)).ttft;
    out.push({ a_to_b_s: toB, b_to_a_s: toA });
  }
  return out;
}

const report = { url, model: args.model, input_len: inLen, output_len: outLen, date: new Date().toISOString(), levels: [] };
await one(args.model, 2); // warm-up: load the model
console.log(`conc  reqs   out tok/s  total tok/s   TTFT p50/p90/p99 ms        ITL p50/p90/p99 ms      E2E p50/p99 ms`);
for (const c of levels) {
  const r = await level(c);
  report.levels.push(r);
  console.log(`${String(c).padStart(4)} ${String(r.requests).padStart(5)} ${r.output_tok_s.toFixed(1).padStart(11)} ${r.total_tok_s.toFixed(1).padStart(12)}   ` +
    `${r.ttft_ms.p50}/${r.ttft_ms.p90}/${r.ttft_ms.p99}`.padEnd(26) + `${r.itl_ms.p50}/${r.itl_ms.p90}/${r.itl_ms.p99}`.padEnd(24) +
    `${r.e2e_ms.p50}/${r.e2e_ms.p99}`);
}
if (args['swap-model']) {
  report.swaps = await swaps(args.model, args['swap-model'], Number(args.swaps || 3));
  for (const s of report.swaps)
    console.log(`swap: ${args.model} -> ${args['swap-model']} first token ${ms(s.a_to_b_s)} ms; back ${ms(s.b_to_a_s)} ms`);
}
if (args.json) (await import('node:fs')).writeFileSync(args.json, JSON.stringify(report, null, 2));

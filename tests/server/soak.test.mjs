// The soak, bounded for CI (issue 25): three models behind --max-resident 1, 64 clients
// streaming at once, each request for a model drawn at random so that the server swaps all
// the time, about 15% of them hanging up at a random point (before the response, after its
// headers, mid-stream).  bench/serve/soak.mjs drives it; bench/gpu/soak.sh is the long form
// on the H200 (200 swaps of 8B checkpoints).  Done when: no request that was not hung up on
// fails (every stream well-formed, one finish_reason, usage, [DONE]); the server is alive,
// healthy and idle after (no live requests, sequences or queued ones; every submitted request
// accounted finished, none with an error); it swapped at least FLOOR.swaps times; with every
// model unloaded its open descriptors are back to the baseline, its threads and resident memory
// within THREAD_SLACK and RSS_SLACK_MIB of it; each model still gives its greedy answer of before.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, procStats, isSanitized, waitFor, LLAMA, QWEN, DEFAULT } from './lib.mjs';
import { soak, metrics } from '../../bench/serve/soak.mjs';

const MODELS = ['llama', 'qwen', 'default'];
const STREAMS = 64;
const DISCONNECT = 0.15;
const WARM_S = 8;
const SOAK_S = 30;
// Under ASan and UBSan (CI's second pass, a Debug -O1 build) a decode step is about ten
// times slower: shorter requests and floors scaled to the requests that fit in the time; what
// that pass checks is memory errors, and leaks at exit (the server must exit 0).
const SAN = isSanitized();
const MAX_TOKENS = SAN ? [2, 8] : [4, 32];
// About 50-60 swaps happen in 30 s on an idle 2-core machine (a swap each time a drained
// model's last request ends), 15 with two builds beside it; the floor leaves room for a busy
// machine while still failing a server that stopped swapping or serving.
const FLOOR = SAN ? { swaps: 3, completed: 40, hung_up: 3, mid_stream: 1, per_model: 5 }
  : { swaps: 8, completed: 100, hung_up: 10, mid_stream: 5, per_model: 10 };
// With every model unloaded, resident memory after a warm-up round measured 141-163 MiB over
// seven 15 s rounds on one server, without a trend: glibc keeps freed blocks in its
// per-thread arenas (the HTTP threads' and the scheduler's), so what a round leaves there
// varies with fragmentation.  Since loads run on a loader thread of their own, whose arena
// is one more (trimmed after each release: atlas_model_release), the spread measured 22-54
// MiB over six runs on a loaded 2-core machine, while a server swapping two models 16 times
// stays flat after its first two (78.0, 80.0, then 80.1 MiB each round).  64 MiB of slack
// sits above that spread and below what a leak of 2 MiB a swap would add (a tiny model's
// weights are 14-20 MiB; this soak makes about 30 swaps).
// Not compared under ASan: its quarantine holds freed memory by design.
const RSS_SLACK_MIB = 64;
const THREAD_SLACK = 16;

let srv;
before(async () => {
  srv = await startServer(['--model', LLAMA, '--model', QWEN, '--model', DEFAULT, '--max-resident', '1']);
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log().slice(-3000)}`);
});

// Each model's greedy reply to one prompt, through the OpenAI SDK (streamed: the text and
// the reasoning of Qwen's <think> block put together).
async function answers(client) {
  const out = {};
  for (const model of MODELS) {
    const stream = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Say something.' }],
      temperature: 0, max_tokens: 10, stream: true });
    let text = '', finish = null;
    for await (const ch of stream) {
      const c = ch.choices[0];
      if (!c) continue;
      text += (c.delta.reasoning_content || '') + (c.delta.content || '');
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.ok(finish, `${model}: no finish_reason`);
    out[model] = text;
  }
  return out;
}

const idle = (m) => m.atlas_requests_active === 0 && m.atlas_running_sequences === 0 &&
  m.atlas_queue_length === 0 && m.atlas_kv_blocks_used === 0;

async function unloadAll() {
  for (const model of MODELS) {
    const r = await postJSON(srv.base, `/v1/models/${model}/unload`, {}, { connection: 'close' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.resident, false, r.text);
  }
  assert.equal((await metrics(srv.base)).atlas_resident_models, 0);
}

// The server's descriptors and threads once they stop changing (closed client sockets are
// noticed a little later).
async function settled() {
  let last = null;
  return waitFor(async () => {
    await new Promise((r) => setTimeout(r, 300));
    const p = procStats(srv.child.pid);
    const same = last && p.fds === last.fds && p.threads === last.threads;
    last = p;
    return same ? p : null;
  }, { timeoutMs: 10000 }) || last;
}

test(`soak: ${STREAMS} streams over ${MODELS.length} models, --max-resident 1, ${DISCONNECT * 100}% hang up`, async () => {
  const t0 = Date.now();
  const client = srv.client();
  const ref = await answers(client);

  // Warm-up: every model loaded and swapped out, the allocator's arenas grown to their use.
  const warm = await soak({ url: srv.base, models: MODELS, streams: STREAMS, duration: WARM_S,
    disconnect: DISCONNECT, maxTokens: MAX_TOKENS, seed: 11, log: null });
  assert.equal(warm.failed, 0, `warm-up: ${JSON.stringify(warm.failures, null, 1)}`);
  assert.ok(await waitFor(async () => idle(await metrics(srv.base))), 'not idle after the warm-up');
  await unloadAll();
  const base = await settled();

  const r = await soak({ url: srv.base, models: MODELS, streams: STREAMS, duration: SOAK_S,
    disconnect: DISCONNECT, maxTokens: MAX_TOKENS, seed: 12, pid: srv.child.pid, log: (s) => console.log(s) });

  // No request that was not hung up on failed, and the load was what it should be.
  assert.equal(r.failed, 0, `failed requests: ${JSON.stringify(r.failures, null, 1)}`);
  assert.ok(r.completed >= FLOOR.completed, `only ${r.completed} requests completed`);
  assert.ok(r.hung_up >= FLOOR.hung_up && r.hangups.mid_stream >= FLOOR.mid_stream,
    `too few hang-ups: ${JSON.stringify(r.hangups)}`);
  for (const m of MODELS) assert.ok(r.per_model[m] >= FLOOR.per_model, `model ${m}: ${r.per_model[m]} requests`);
  assert.ok(r.swaps >= FLOOR.swaps, `${r.swaps} swaps, fewer than ${FLOOR.swaps}`);
  assert.equal(r.server.load_failures, 0);
  assert.equal(r.server.errors, 0, 'requests finished with an error');
  assert.equal(r.server.rejected, 0, 'requests refused (queue full)');
  // A client gone before its first event is answered (to nobody) 499, a client's doing: no
  // request may count as a server error. The server's lines for any 5xx are printed first,
  // so that a failure says which status and route it was.
  if (r.server.http_5xx)
    for (const l of srv.log().split('\n')) if (/status=5\d\d /.test(l)) console.log(`server: ${l.slice(0, 400)}`);
  assert.equal(r.server.http_5xx, 0,
    `${r.server.http_5xx} 5xx (${r.hangups.before_response} hang-ups before the response)`);
  assert.ok(r.server.cancelled >= r.hangups.mid_stream / 2,
    `${r.server.cancelled} requests cancelled for ${r.hangups.mid_stream} hung up mid-stream`);

  // Alive, healthy, and idle: every request the engine took ended, none is live.
  assert.equal(srv.child.exitCode, null, 'the server exited');
  assert.equal((await fetch(`${srv.base}/health`, { headers: { connection: 'close' } })).status, 200);
  let m = null;
  assert.ok(await waitFor(async () => idle(m = await metrics(srv.base))),
    `not idle after the soak: active ${m.atlas_requests_active}, running ${m.atlas_running_sequences}, ` +
    `queued ${m.atlas_queue_length}, KV blocks ${m.atlas_kv_blocks_used}`);
  const ended = ['stop', 'length', 'cancelled', 'error']
    .reduce((a, k) => a + m[`atlas_requests_finished_total{reason="${k}"}`], 0);
  assert.equal(ended, m.atlas_requests_submitted_total, 'requests submitted but never finished');

  // Everything unloaded again: descriptors, threads and memory back to the baseline.
  await unloadAll();
  const end = await settled();
  const sanitized = isSanitized();
  console.log(`RSS ${(base.rssKiB / 1024).toFixed(1)} MiB after the warm-up, peak ${(r.memory.rss_peak_kib / 1024).toFixed(1)}, ` +
    `${(end.rssKiB / 1024).toFixed(1)} at the end (all unloaded)${sanitized ? ' (ASan: not compared)' : ''}; ` +
    `fds ${base.fds} -> ${end.fds}; threads ${base.threads} -> ${end.threads}; ${((Date.now() - t0) / 1000).toFixed(1)} s in all`);
  assert.ok(end.fds <= base.fds, `open descriptors ${base.fds} -> ${end.fds}`);
  // The HTTP worker pool grows to the most requests in hand at once and keeps its threads;
  // the warm-up grew it to about the 64 streams.  A request hung up on keeps its worker until
  // the server notices, while its client has sent the next, so the pool may grow a little
  // more; a thread lost per request (or per hang-up: about 190) would not fit in the slack.
  assert.ok(end.threads <= base.threads + THREAD_SLACK, `threads ${base.threads} -> ${end.threads}`);
  if (!sanitized)
    assert.ok(end.rssKiB - base.rssKiB < RSS_SLACK_MIB * 1024,
      `RSS ${base.rssKiB} KiB after the warm-up, ${end.rssKiB} KiB after the soak`);

  // And each model still answers as before all the swapping.
  assert.deepEqual(await answers(client), ref);
});

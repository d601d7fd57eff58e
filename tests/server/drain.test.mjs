// --drain-timeout with --max-resident 1: a long stream on llama holds a request for qwen no
// longer than the timeout.  Then the stream's sequence is paused (its KV goes with the
// model), qwen is swapped in and answers, and the stream, which only waited, resumes once
// llama is back (recomputed from its prompt and the tokens so far) and ends with the text
// of an undisturbed run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { startServer, greedy, BIN, LLAMA, QWEN } from './lib.mjs';

const DRAIN_S = 0.5;
const long = (n) => ({ model: 'llama', prompt: 'Once upon a time', max_tokens: n, ignore_eos: true, temperature: 0, stream: true });

// Streams body to its end; onFirst is called at the first chunk.
async function stream(client, body, onFirst = () => {}) {
  let text = '', finish = null, chunks = 0;
  for await (const ch of await client.completions.create(body)) {
    if (chunks++ === 0) onFirst();
    text += ch.choices[0]?.text ?? '';
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish, chunks };
}

const metric = async (srv, name) =>
  Number((await (await fetch(`${srv.base}/metrics`)).text()).match(new RegExp(`^${name} (\\S+)`, 'm'))[1]);

test('a request for another model is answered after the drain timeout; the paused stream resumes with the same text', async () => {
  const srv = await startServer(['--model', LLAMA, '--model', QWEN, '--max-resident', '1', '--drain-timeout', String(DRAIN_S)]);
  try {
    const client = srv.client();
    // each model's first request (its tokenizer and template loaded) out of the timings
    await client.chat.completions.create(greedy('qwen', 'hi', { max_tokens: 3 }));
    await stream(client, long(100));
    // the undisturbed run, long enough to outlast the timeout three times over here
    let n = 2000, alone, took;
    for (;;) {
      const t0 = Date.now();
      alone = await stream(client, long(n));
      took = (Date.now() - t0) / 1000;
      if (took >= DRAIN_S * 3 || n >= 100000) break;
      n = Math.min(Math.ceil((n * DRAIN_S * 4.5) / Math.max(took, 0.01)), 100000);
    }
    assert.equal(alone.finish, 'length');

    const pauses0 = await metric(srv, 'atlas_preemptions_total');
    let running;
    const started = new Promise((r) => { running = r; });
    let streamEnded = false;
    const disturbed = stream(client, long(n), running).then((r) => { streamEnded = true; return r; });
    disturbed.catch(() => {}); // awaited below; a failed check before then is the one to report
    await started;
    const tq = Date.now();
    const q = await client.chat.completions.create(greedy('qwen', 'hi', { max_tokens: 3 }));
    const waited = (Date.now() - tq) / 1000;
    const endedFirst = streamEnded;
    const swapS = await metric(srv, 'atlas_last_swap_seconds'); // llama released, qwen loaded
    assert.equal(q.usage.completion_tokens, 3);
    assert.ok(!endedFirst, `qwen was answered only after llama's stream of ${n} tokens ended`);
    assert.ok(waited >= DRAIN_S * 0.9, `qwen answered after ${waited} s: llama's stream did not get its ${DRAIN_S} s`);
    // the timeout plus a swap, and a second for qwen's own tokens on a busy machine
    assert.ok(waited < DRAIN_S + swapS + 1, `qwen waited ${waited} s (swap ${swapS} s)`);

    const d = await disturbed;
    assert.equal(d.finish, 'length');
    assert.equal(d.text.length, alone.text.length);
    assert.ok(d.text === alone.text, 'the resumed stream differs from the undisturbed one');
    assert.ok((await metric(srv, 'atlas_preemptions_total')) > pauses0, 'llama was not paused');
    console.log(`${n} tokens in ${took.toFixed(2)} s alone; qwen answered in ${waited.toFixed(3)} s (swap ${swapS.toFixed(3)} s)`);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
  }
});

test('--drain-timeout is in --help; a bad value is refused by name', () => {
  const help = spawnSync(BIN, ['serve', '--help'], { encoding: 'utf8' });
  assert.equal(help.status, 0);
  assert.match(help.stdout, /--drain-timeout S .*default 30; 0: until they end/s);
  for (const v of ['-1', 'soon', '1e9', 'nan']) {
    const r = spawnSync(BIN, ['serve', '--drain-timeout', v], { encoding: 'utf8' });
    assert.equal(r.status, 2, v);
    assert.match(r.stderr, new RegExp(`--drain-timeout: '${v}' is not a number of seconds in 0\\.\\.86400`));
  }
});

// tests/server/embedmodel.mjs — tiny embedding checkpoints in Qwen3-Embedding's layout, made
// at test time from the small Qwen3 fixture (tests/data/small/qk-norm: random weights, hidden
// 32, 2 layers, q/k norm, a byte-level vocabulary of 256): its tensors renamed without the
// "model." prefix and no lm_head (as Qwen3-Embedding ships its Qwen3Model), a config that says
// Qwen3ForCausalLM with untied embeddings, a tokenizer.json whose post-processor appends
// <|endoftext|> (id 256) as Qwen3-Embedding's does, and sentence-transformers' modules.json,
// 1_Pooling/config.json and, when normalised, 2_Normalize.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { DATA } from './lib.mjs';

const SRC = path.join(DATA, 'small', 'qk-norm');
export const EOS = 256;

// model.safetensors with every "model.X" tensor named "X" (the data bytes unchanged).
function bareWeights() {
  const buf = readFileSync(path.join(SRC, 'model.safetensors'));
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const out = {};
  for (const [k, v] of Object.entries(header)) out[k.startsWith('model.') ? k.slice(6) : k] = v;
  let text = JSON.stringify(out);
  while (Buffer.byteLength(text) % 8) text += ' ';
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(Buffer.byteLength(text)));
  return Buffer.concat([head, Buffer.from(text), buf.subarray(8 + n)]);
}

function tokenizer() {
  const t = JSON.parse(readFileSync(path.join(SRC, 'tokenizer.json'), 'utf8'));
  t.added_tokens = [{ id: EOS, content: '<|endoftext|>', single_word: false, lstrip: false,
    rstrip: false, normalized: false, special: true }];
  t.post_processor = { type: 'Sequence', processors: [
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    { type: 'TemplateProcessing',
      single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|endoftext|>', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|endoftext|>', type_id: 0 } },
        { Sequence: { id: 'B', type_id: 1 } }, { SpecialToken: { id: '<|endoftext|>', type_id: 1 } }],
      special_tokens: { '<|endoftext|>': { id: '<|endoftext|>', ids: [EOS], tokens: ['<|endoftext|>'] } } },
  ] };
  return JSON.stringify(t);
}

// Writes an embedding model into dir: pooling 'last', 'mean' or 'cls'; normalize adds the
// Normalize module; config holds config.json keys to add (is_matryoshka, is_causal, ...).
export function writeEmbedModel(dir, { pooling = 'last', normalize = true, config = {} } = {}) {
  mkdirSync(path.join(dir, '1_Pooling'), { recursive: true });
  const cfg = JSON.parse(readFileSync(path.join(SRC, 'config.json'), 'utf8'));
  Object.assign(cfg, { tie_word_embeddings: false, eos_token_id: EOS }, config);
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg, null, 2));
  writeFileSync(path.join(dir, 'model.safetensors'), bareWeights());
  writeFileSync(path.join(dir, 'tokenizer.json'), tokenizer());
  const modules = [
    { idx: 0, name: '0', path: '', type: 'sentence_transformers.models.Transformer' },
    { idx: 1, name: '1', path: '1_Pooling', type: 'sentence_transformers.models.Pooling' },
  ];
  if (normalize) {
    mkdirSync(path.join(dir, '2_Normalize'), { recursive: true });
    modules.push({ idx: 2, name: '2', path: '2_Normalize', type: 'sentence_transformers.models.Normalize' });
  }
  writeFileSync(path.join(dir, 'modules.json'), JSON.stringify(modules, null, 2));
  writeFileSync(path.join(dir, '1_Pooling', 'config.json'), JSON.stringify({
    word_embedding_dimension: cfg.hidden_size,
    pooling_mode_cls_token: pooling === 'cls',
    pooling_mode_mean_tokens: pooling === 'mean',
    pooling_mode_max_tokens: false,
    pooling_mode_mean_sqrt_len_tokens: false,
    pooling_mode_weightedmean_tokens: false,
    pooling_mode_lasttoken: pooling === 'last',
    include_prompt: true,
  }, null, 2));
  return dir;
}

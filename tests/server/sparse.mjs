// tests/server/sparse.mjs — a checkpoint far larger than this machine's memory that costs no
// disk: a real config.json and tokenizer.json, and a model.safetensors whose header declares
// every tensor of a Llama of 36B parameters or more (68 GiB of BF16, or twice the machine's
// memory where that is more) with the data left a hole (truncate), so
// reading any weight would read zeros from nowhere and a load would need all of it in RAM.
import { copyFileSync, mkdtempSync, openSync, closeSync, ftruncateSync, writeSync, writeFileSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const REPO = path.join(path.dirname(new URL(import.meta.url).pathname), '..', '..');

export const SPARSE_CONFIG = {
  architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 8192,
  intermediate_size: 28672, num_hidden_layers: 40, num_attention_heads: 64,
  num_key_value_heads: 8, head_dim: 128, vocab_size: 128256, max_position_embeddings: 8192,
  rms_norm_eps: 1e-5, rope_theta: 500000.0, tie_word_embeddings: false, torch_dtype: 'bfloat16',
  bos_token_id: 0, eos_token_id: 0,
};

// The tensors of a Llama of config c, in a safetensors header: {name: {dtype, shape, data_offsets}}.
function header(c) {
  const d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  const shapes = [['model.embed_tokens.weight', [c.vocab_size, d]], ['model.norm.weight', [d]],
    ['lm_head.weight', [c.vocab_size, d]]];
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}`;
    shapes.push([`${p}.input_layernorm.weight`, [d]], [`${p}.post_attention_layernorm.weight`, [d]],
      [`${p}.self_attn.q_proj.weight`, [c.num_attention_heads * hd, d]],
      [`${p}.self_attn.k_proj.weight`, [c.num_key_value_heads * hd, d]],
      [`${p}.self_attn.v_proj.weight`, [c.num_key_value_heads * hd, d]],
      [`${p}.self_attn.o_proj.weight`, [d, c.num_attention_heads * hd]],
      [`${p}.mlp.gate_proj.weight`, [f, d]], [`${p}.mlp.up_proj.weight`, [f, d]],
      [`${p}.mlp.down_proj.weight`, [d, f]]);
  }
  const h = {};
  let off = 0, params = 0;
  for (const [name, shape] of shapes) {
    const n = shape.reduce((a, b) => a * b, 1);
    h[name] = { dtype: 'BF16', shape, data_offsets: [off, off + 2 * n] };
    off += 2 * n;
    params += n;
  }
  return { h, bytes: off, params };
}

// Makes the directory, with layers enough for twice this machine's memory (40 at least: 36B
// parameters, 68 GiB); returns {dir, config, bytes (declared tensor data), params,
// fileBytes, diskBytes}.
export function sparseCheckpoint(base = SPARSE_CONFIG) {
  const config = { ...base };
  const perLayer = (header({ ...config, num_hidden_layers: 2 }).bytes -
                    header({ ...config, num_hidden_layers: 1 }).bytes);
  config.num_hidden_layers = Math.max(config.num_hidden_layers, Math.ceil(2 * os.totalmem() / perLayer));
  const dir = mkdtempSync(path.join(os.tmpdir(), 'atlas-sparse-'));
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config, null, 2));
  copyFileSync(path.join(REPO, 'models', 'default', 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  const { h, bytes, params } = header(config);
  let json = Buffer.from(JSON.stringify(h));
  const pad = (8 - (json.length % 8)) % 8; // data 8-byte aligned, as the safetensors library writes
  json = Buffer.concat([json, Buffer.alloc(pad, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  const file = path.join(dir, 'model.safetensors');
  const fd = openSync(file, 'w');
  writeSync(fd, len);
  writeSync(fd, json);
  ftruncateSync(fd, 8 + json.length + bytes); // the data: a hole, no block on disk
  closeSync(fd);
  const st = statSync(file);
  return { dir, config, bytes, params, fileBytes: st.size, diskBytes: st.blocks * 512 };
}

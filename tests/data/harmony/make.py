#!/usr/bin/env python3
"""Writes two tiny Llama checkpoints that speak Harmony, for the server tests: a byte-level
vocabulary (tests/data/small/qk-norm's 256 ids) plus Harmony's special tokens and a few
words as added tokens, and weights made by hand so that greedy decoding gives one reply
whatever the prompt (python3 make.py, stdlib only; the output is committed).

The one layer's MLP and attention scores are zero, so a position's hidden state is its
token's embedding (one-hot: one dimension per token of the reply) plus what uniform
attention brings from earlier positions; lm_head sends each token's dimension to the token
that follows it.  reason/ replies
  <|channel|>analysis<|message|>Hmm let me think.<|end|><|start|>assistant<|channel|>final
  <|message|>Hello world<|return|>
in which <|channel|> and <|message|> each have two successors: the attention's values carry
"Hmm" into a dimension SEEN (its share of the positions so far), which tips lm_head toward
the second successor once "Hmm" has been written.  tool/ replies
  <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
and, should <|call|> not end the reply, goes on with Hello<|return|>.  Both expect the prompt
to end with "assistant" (gpt-oss's template ends with <|start|>assistant).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, '..', 'small', 'qk-norm', 'tokenizer.json')

SPECIAL = ['<|start|>', '<|end|>', '<|message|>', '<|channel|>', '<|constrain|>', '<|return|>',
           '<|call|>']
WORDS = ['assistant', 'analysis', 'final', 'commentary', ' to=functions.get_weather ', 'json',
         'Hmm', ' let me think.', 'Hello', ' world', '{"city": "Paris"}']
VOCAB, HIDDEN, INTER, HEADS, HEAD_DIM = 288, 32, 32, 2, 16
ID = {t: 256 + i for i, t in enumerate(SPECIAL + WORDS)}
SEEN = HIDDEN - 1  # the dimension attention writes "Hmm was written" into


def tokenizer():
    t = json.load(open(SRC))
    t['added_tokens'] = [{'id': ID[c], 'content': c, 'single_word': False, 'lstrip': False,
                          'rstrip': False, 'normalized': c not in SPECIAL,
                          'special': c in SPECIAL} for c in SPECIAL + WORDS]
    return t


def bf16(x):
    return struct.unpack('<I', struct.pack('<f', x))[0] >> 16  # exact for the values used


def safetensors(tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = struct.pack('<%dH' % len(values), *[bf16(v) for v in values])
        header[name] = {'dtype': 'BF16', 'shape': shape, 'data_offsets': [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header)
    text += ' ' * (-len(text) % 8)
    return struct.pack('<Q', len(text)) + text.encode() + b''.join(blobs)


def weights(chain, switch):
    """chain: [(token, next)]; switch: {token: other next once "Hmm" was written}."""
    dim = {}
    for a, _ in chain:
        dim.setdefault(a, len(dim))
    assert len(dim) < SEEN
    embed = [0.0] * (VOCAB * HIDDEN)
    head = [0.0] * (VOCAB * HIDDEN)
    for tok, d in dim.items():
        embed[ID[tok] * HIDDEN + d] = 1.0
    for a, b in chain:
        head[ID[b] * HIDDEN + dim[a]] = 100.0
    for a, b in switch.items():
        head[ID[b] * HIDDEN + dim[a]] = 99.0
        head[ID[b] * HIDDEN + SEEN] = 128.0
    v = [0.0] * (HEAD_DIM * HIDDEN)  # one KV head: its value's first dim is "Hmm"'s share
    o = [0.0] * (HIDDEN * HEADS * HEAD_DIM)
    if switch:
        v[0 * HIDDEN + dim['Hmm']] = 1.0
        o[SEEN * HEADS * HEAD_DIM + 0] = 1.0
    zero = lambda *shape: (list(shape), [0.0] * eval('*'.join(map(str, shape))))
    p = 'model.layers.0.'
    return safetensors({
        'model.embed_tokens.weight': ([VOCAB, HIDDEN], embed),
        'lm_head.weight': ([VOCAB, HIDDEN], head),
        'model.norm.weight': ([HIDDEN], [1.0] * HIDDEN),
        p + 'input_layernorm.weight': ([HIDDEN], [1.0] * HIDDEN),
        p + 'post_attention_layernorm.weight': ([HIDDEN], [1.0] * HIDDEN),
        p + 'self_attn.q_proj.weight': zero(HEADS * HEAD_DIM, HIDDEN),
        p + 'self_attn.k_proj.weight': zero(HEAD_DIM, HIDDEN),
        p + 'self_attn.v_proj.weight': ([HEAD_DIM, HIDDEN], v),
        p + 'self_attn.o_proj.weight': ([HIDDEN, HEADS * HEAD_DIM], o),
        p + 'mlp.gate_proj.weight': zero(INTER, HIDDEN),
        p + 'mlp.up_proj.weight': zero(INTER, HIDDEN),
        p + 'mlp.down_proj.weight': zero(HIDDEN, INTER),
    })


def pairs(seq):
    return list(zip(seq, seq[1:]))


def write(name, chain, switch):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    config = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama',
              'hidden_size': HIDDEN, 'intermediate_size': INTER, 'num_hidden_layers': 1,
              'num_attention_heads': HEADS, 'num_key_value_heads': 1, 'head_dim': HEAD_DIM,
              'vocab_size': VOCAB, 'max_position_embeddings': 4096, 'rms_norm_eps': 1e-6,
              'rope_theta': 10000.0, 'tie_word_embeddings': False, 'torch_dtype': 'bfloat16',
              'eos_token_id': ID['<|return|>']}
    files = {'config.json': config, 'generation_config.json': {'eos_token_id': ID['<|return|>']},
             'tokenizer.json': tokenizer(),
             'tokenizer_config.json': {'eos_token': '<|return|>', 'pad_token': '<|end|>'}}
    for f, v in files.items():
        with open(os.path.join(d, f), 'w') as fh:
            json.dump(v, fh, indent=1, ensure_ascii=False)
            fh.write('\n')
    with open(os.path.join(d, 'model.safetensors'), 'wb') as fh:
        fh.write(weights(chain, switch))


REASON = ['assistant', '<|channel|>', 'analysis', '<|message|>', 'Hmm', ' let me think.', '<|end|>',
          '<|start|>', 'assistant']
write('reason', pairs(REASON) + pairs(['final', '<|message|>']) + pairs(['Hello', ' world', '<|return|>']),
      {'<|channel|>': 'final', '<|message|>': 'Hello'})
TOOL = ['assistant', '<|channel|>', 'commentary', ' to=functions.get_weather ', '<|constrain|>', 'json',
        '<|message|>', '{"city": "Paris"}', '<|call|>', 'Hello', '<|return|>']
write('tool', pairs(TOOL), {})

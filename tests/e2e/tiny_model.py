#!/usr/bin/env python3
"""Writes a tiny random Llama checkpoint (fp32 safetensors, byte-level BPE
tokenizer) for the CLI end-to-end tests. Standard library only.
usage: tiny_model.py OUT_DIR [--bf16]"""
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from byte_level import bytes_to_unicode  # noqa: E402

out = sys.argv[1]
bf16 = "--bf16" in sys.argv
os.makedirs(out, exist_ok=True)
H, I, L, NH, NKV, V = 32, 64, 2, 4, 2, 272
D = H // NH
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
       "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "vocab_size": V,
       "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "bos_token_id": 257, "eos_token_id": 256, "torch_dtype": "bfloat16" if bf16 else "float32"}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
rng = random.Random(1234)
tensors = {}
def mat(name, r, c, std=0.3):
    tensors[name] = ([r, c], [rng.gauss(0, std) for _ in range(r * c)])
def vec(name, n):
    tensors[name] = ([n], [1.0 + rng.gauss(0, 0.1) for _ in range(n)])
mat("model.embed_tokens.weight", V, H)
mat("lm_head.weight", V, H)
vec("model.norm.weight", H)
for l in range(L):
    p = f"model.layers.{l}."
    vec(p + "input_layernorm.weight", H)
    vec(p + "post_attention_layernorm.weight", H)
    mat(p + "self_attn.q_proj.weight", NH * D, H)
    mat(p + "self_attn.k_proj.weight", NKV * D, H)
    mat(p + "self_attn.v_proj.weight", NKV * D, H)
    mat(p + "self_attn.o_proj.weight", H, NH * D)
    mat(p + "mlp.gate_proj.weight", I, H)
    mat(p + "mlp.up_proj.weight", I, H)
    mat(p + "mlp.down_proj.weight", H, I)
header, blobs, off = {}, [], 0
for name, (shape, vals) in sorted(tensors.items()):
    if bf16 and len(shape) == 2:
        raw = b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in vals)
        dt = "BF16"
    else:
        raw = struct.pack(f"<{len(vals)}f", *vals)
        dt = "F32"
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
    blobs.append(raw)
    off += len(raw)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

b2u = bytes_to_unicode()
vocab = {b2u[b]: b for b in range(256)}
vocab["<|endoftext|>"] = 256
vocab["<|begin|>"] = 257
added = [dict(id=i, content=c, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
         for i, c in [(256, "<|endoftext|>"), (257, "<|begin|>")]]
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": {"type": "TemplateProcessing",
                          "single": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                          "pair": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                   {"Sequence": {"id": "B", "type_id": 1}}],
                          "special_tokens": {"<|begin|>": {"id": "<|begin|>", "ids": [257], "tokens": ["<|begin|>"]}}},
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": vocab, "merges": []}}
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
json.dump({"bos_token": "<|begin|>", "eos_token": "<|endoftext|>"}, open(os.path.join(out, "tokenizer_config.json"), "w"))

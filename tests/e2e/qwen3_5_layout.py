#!/usr/bin/env python3
"""Rewrites a Qwen3_5ForCausalLM checkpoint directory in place into the
Qwen3_5ForConditionalGeneration layout the Hub ships (stdlib only):
config.json gets architectures [Qwen3_5ForConditionalGeneration],
model_type qwen3_5 and the text config under text_config (model_type
qwen3_5_text); every tensor `model.X` of model.safetensors becomes
`model.language_model.X` (lm_head.weight is unchanged).
  qwen3_5_layout.py DIR
"""
import json
import os
import struct
import sys

d = sys.argv[1]
cfg_path = os.path.join(d, "config.json")
text = json.load(open(cfg_path))
assert text.get("architectures") == ["Qwen3_5ForCausalLM"], text.get("architectures")
text.pop("architectures")
top = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
       "tie_word_embeddings": text.get("tie_word_embeddings", False), "text_config": text}
json.dump(top, open(cfg_path, "w"), indent=1)

st = os.path.join(d, "model.safetensors")
b = open(st, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
header = json.loads(b[8:8 + n])
out = {}
for name, e in header.items():
    out["model.language_model." + name[len("model."):] if name.startswith("model.") else name] = e
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(st, "wb").write(struct.pack("<Q", len(h)) + h + b[8 + n:])

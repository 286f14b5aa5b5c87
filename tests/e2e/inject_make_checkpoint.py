#!/usr/bin/env python3
"""Writes a tiny llama checkpoint (config.json + safetensors, float32, random
weights) with the Python standard library only, for the inject / calibrate
end-to-end tests.

  inject_make_checkpoint.py DIR [--sharded] [--outlier-layer L --gain G] [--seed S]

--outlier-layer plants a V outlier: one output row of that layer's v_proj is
multiplied by G, so its V values exceed the e4m3 range at unity scale.
"""
import argparse
import json
import os
import random
import struct

CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "eos_token_id": 2, "bos_token_id": 1, "torch_dtype": "float32",
}


def tensors(args):
    H, I, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    Hq, Hkv = CFG["num_attention_heads"], CFG["num_key_value_heads"]
    D = H // Hq
    out = [("model.embed_tokens.weight", [V, H])]
    for l in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", [H]),
                (p + "self_attn.q_proj.weight", [Hq * D, H]),
                (p + "self_attn.k_proj.weight", [Hkv * D, H]),
                (p + "self_attn.v_proj.weight", [Hkv * D, H]),
                (p + "self_attn.o_proj.weight", [H, Hq * D]),
                (p + "post_attention_layernorm.weight", [H]),
                (p + "mlp.gate_proj.weight", [I, H]),
                (p + "mlp.up_proj.weight", [I, H]),
                (p + "mlp.down_proj.weight", [H, I])]
    out += [("model.norm.weight", [H]), ("lm_head.weight", [V, H])]
    rng = random.Random(args.seed)
    res = []
    for name, shape in out:
        n = 1
        for d in shape:
            n *= d
        if len(shape) == 1:
            vals = [1.0 + 0.1 * rng.gauss(0, 0.08) for _ in range(n)]
        else:
            vals = [rng.gauss(0, 0.08) for _ in range(n)]
        if args.outlier_layer is not None and name == f"model.layers.{args.outlier_layer}.self_attn.v_proj.weight":
            cols, row = shape[1], 5
            for c in range(cols):
                vals[row * cols + c] *= args.gain
        res.append((name, shape, struct.pack(f"<{n}f", *vals)))
    return res


def write_safetensors(path, items):
    header, pos = {}, 0
    for name, shape, data in items:
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in items:
            f.write(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--outlier-layer", type=int)
    ap.add_argument("--gain", type=float, default=400.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2)
    items = tensors(args)
    if not args.sharded:
        write_safetensors(os.path.join(args.dir, "model.safetensors"), items)
        return
    a, b = items[::2], items[1::2]
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    write_safetensors(os.path.join(args.dir, names[0]), a)
    write_safetensors(os.path.join(args.dir, names[1]), b)
    wm = {n: names[0] for n, _, _ in a}
    wm.update({n: names[1] for n, _, _ in b})
    total = sum(len(d) for _, _, d in items)
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)


if __name__ == "__main__":
    main()

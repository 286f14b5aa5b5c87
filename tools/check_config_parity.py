#!/usr/bin/env python3
"""What transformers derives from each config in tests/data/config_cases/cases.json.

Run from the repository root on the GPU machine (needs transformers 5):

    python3 tools/check_config_parity.py [--out tests/golden/config_parity/expected.json]

Each case is written as config.json into a temporary directory and loaded
with AutoConfig.from_pretrained, the path a real checkpoint takes. Recorded
per case: num_kv_heads, head_dim, the effective window of every layer (the
window the attention module uses: Qwen2/Qwen3/Gemma3 take
config.sliding_window on layers typed sliding_attention, Mistral on every
layer, Llama none), rope type/theta/factor per layer type, tie_word_embeddings,
eos_token_id, query_pre_attn_scalar; or the error transformers raised.
tests/model/test_config_parity.cpp compares fp8kv's parser against it.
"""
import argparse
import json
import os
import sys
import tempfile

import transformers
from transformers import AutoConfig


def rope_for(tc, layer_type):
    rp = getattr(tc, "rope_parameters", None)
    if rp is None:  # transformers 4 fallback
        rs = getattr(tc, "rope_scaling", None) or {}
        theta = getattr(tc, "rope_theta", None)
        if layer_type == "sliding_attention" and hasattr(tc, "rope_local_base_freq"):
            return {"rope_type": "default", "rope_theta": tc.rope_local_base_freq, "factor": 1.0}
        return {"rope_type": rs.get("rope_type", rs.get("type", "default")), "rope_theta": theta,
                "factor": rs.get("factor", 1.0)}
    if layer_type in rp and isinstance(rp[layer_type], dict):
        rp = rp[layer_type]
    return {"rope_type": rp.get("rope_type", "default"), "rope_theta": rp.get("rope_theta"),
            "factor": rp.get("factor", 1.0)}


def derive(cfg):
    tc = cfg.get_text_config()
    mt = tc.model_type
    L = tc.num_hidden_layers
    heads = tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    sw = getattr(tc, "sliding_window", None)
    types = getattr(tc, "layer_types", None)
    if mt == "llama":
        windows = [0] * L
    elif mt == "mistral":
        windows = [sw or 0] * L
    else:  # qwen2, qwen3, gemma3_text: per layer type
        windows = [(sw or 0) if t == "sliding_attention" else 0 for t in types]
    out = {
        "model_type": cfg.model_type,
        "num_kv_heads": tc.num_key_value_heads,
        "head_dim": head_dim,
        "windows": windows,
        "rope_full": rope_for(tc, "full_attention"),
        "rope_sliding": rope_for(tc, "sliding_attention"),
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", getattr(tc, "tie_word_embeddings", False))),
        "eos_token_id": getattr(cfg, "eos_token_id", None) if getattr(cfg, "eos_token_id", None) is not None
        else getattr(tc, "eos_token_id", None),
        "vocab_size": tc.vocab_size,
    }
    if mt == "gemma3_text":
        out["query_pre_attn_scalar"] = tc.query_pre_attn_scalar
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="tests/data/config_cases/cases.json")
    ap.add_argument("--out", default="tests/golden/config_parity/expected.json")
    args = ap.parse_args()
    cases = json.load(open(args.cases))
    results = {}
    for name, c in cases.items():
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(c, f)
            try:
                results[name] = derive(AutoConfig.from_pretrained(d))
            except Exception as e:  # record what transformers rejects
                results[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(name, json.dumps(results[name])[:200])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"generator": "tools/check_config_parity.py", "transformers": transformers.__version__,
                   "cases": results}, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out} ({len(results)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

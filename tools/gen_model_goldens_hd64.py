#!/usr/bin/env python3
"""Tiny random checkpoints with the head sizes the CUDA kernels take (64;
Gemma 3: 256) for every family, plus transformers references (issue 12 §4).

Runs on the GPU machine (torch + transformers, no network), from the repo root:

    python3 tools/gen_model_goldens_hd64.py

Writes tests/golden/models_hd64/<case>/ in the format of
tools/gen_model_goldens.py (whose helpers it reuses): config.json,
model.safetensors (bf16), tokenizer files, golden.json with the variants fp32,
bf16, fp8_e4m3, fp8_e5m2 (fp32 eager attention on the bf16-rounded weights,
K/V rounded at the cache-write point as each cache dtype stores them), and
kv.safetensors with the fp32 K/V of layer 0 only (the only layer the C++ test
compares; keeps the goldens small).

In addition, golden.json holds variant "hf_bf16": the same checkpoint run the
way a transformers user runs it in bf16 (model.to(bfloat16), eager attention,
on CUDA when present), and "hf_bf16_gap": mean and max |logprob(hf_bf16) -
logprob(fp32)| per sequence and over all. That gap is the tolerance basis of
the CUDA backend with a bf16 cache (issue 12 §4: within 1.5x of it, and never
worse than a mean of 0.02).

Deterministic (seeded); fails when a checkpoint dir exceeds 1.5 MB or the
total 3 MB.
"""
import copy
import json
import os
import shutil
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model_goldens as base  # noqa: E402

OUT = os.path.join("tests", "golden", "models_hd64")
SEQ_LENS = [48, 64]
CASE_LIMIT = 1536 * 1024
TOTAL_LIMIT = 3 * 1024 * 1024

# Llama, Mistral, Qwen2: hidden = heads x head_dim (2 x 64, one KV head), so
# head_dim is 64 whether or not a transformers version reads the head_dim key.
# Qwen3 and Gemma 3 take head_dim explicitly; hidden 64 keeps them small (q/o
# projections are [heads*head_dim, hidden] as in the real models).
C64 = dict(base.COMMON, hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
           head_dim=64)

CASES = {
    "llama": dict(C64, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=2,
                  rope_theta=500000.0, tie_word_embeddings=False, rope_scaling=base.LLAMA3_ROPE_SCALING),
    "mistral": dict(C64, architectures=["MistralForCausalLM"], model_type="mistral", num_hidden_layers=2,
                    rope_theta=10000.0, sliding_window=20, tie_word_embeddings=False),
    "qwen2": dict(C64, architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_hidden_layers=2,
                  rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False, sliding_window=None),
    "qwen3": dict(C64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=2,
                  rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=True,
                  sliding_window=12, max_window_layers=1,
                  layer_types=["full_attention", "sliding_attention"]),
    "gemma3": dict(base.COMMON, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=256, architectures=["Gemma3ForCausalLM"],
                   model_type="gemma3_text", num_hidden_layers=2, query_pre_attn_scalar=256,
                   hidden_activation="gelu_pytorch_tanh", sliding_window=12, rope_theta=1000000.0,
                   rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
                   tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
                   layer_types=["sliding_attention", "full_attention"]),
}

log = base.log


def check_shapes(model, cfg_dict):
    attn = model.model.layers[0].self_attn
    want_q = cfg_dict["num_attention_heads"] * cfg_dict["head_dim"]
    want_k = cfg_dict["num_key_value_heads"] * cfg_dict["head_dim"]
    if attn.q_proj.out_features != want_q or attn.k_proj.out_features != want_k:
        raise RuntimeError(f"{cfg_dict['model_type']}: head_dim not honoured "
                           f"(q_proj {attn.q_proj.out_features}, want {want_q})")


def score_bf16(model32, seqs, hook):
    """The bf16 run a transformers user gets: every parameter and activation
    in bf16 (eager attention, softmax in fp32 as transformers upcasts it)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = copy.deepcopy(model32).to(torch.bfloat16).to(dev).eval()
    hook.fmt, hook.scales, hook.record = "fp32", None, None  # pass-through
    out = []
    for ids in seqs:
        with torch.no_grad():
            logits = m(torch.tensor([ids], device=dev), use_cache=False).logits[0].float().cpu()
        lsm = torch.log_softmax(logits.double(), dim=-1)
        out.append({"logprobs": [None] + [float(lsm[i - 1, ids[i]]) for i in range(1, len(ids))],
                    "top1_ids": [None] + [int(torch.argmax(logits[i - 1]).item()) for i in range(1, len(ids))]})
    del m
    return out, dev


def gap(a, b):
    d = [abs(x - y) for x, y in zip(a["logprobs"][1:], b["logprobs"][1:])]
    return d


def run_case(case, cfg_dict, hook, hooked):
    torch.use_deterministic_algorithms(True)
    out_dir = os.path.join(OUT, case)
    model = base.make_model(case + "_hd64", cfg_dict, out_dir)
    check_shapes(model, cfg_dict)
    mod = base.modeling_module(model)
    if mod not in hooked:
        hook.install([mod])
        hooked.add(mod)
    cfg = model.config
    L, Hkv = cfg.num_hidden_layers, cfg.num_key_value_heads
    gen = torch.Generator().manual_seed(2000 + len(case))
    seqs = [[base.BOS] + torch.randint(0, 256, (n - 1,), generator=gen).tolist() for n in SEQ_LENS]

    variants, rec = base.score_fp32_recorded(model, hook, seqs)

    scales = base.fp8_scales(rec, len(seqs), L, Hkv)
    base.score_cache_variants(model, hook, seqs, scales, variants)

    torch.use_deterministic_algorithms(False)  # cuBLAS bf16 on CUDA
    variants["hf_bf16"], dev = score_bf16(model, seqs, hook)
    per_seq = [gap(a, b) for a, b in zip(variants["hf_bf16"], variants["fp32"])]
    flat = [x for d in per_seq for x in d]
    hf_gap = {"device": dev,
              "mean_abs": sum(flat) / len(flat), "max_abs": max(flat),
              "per_sequence_mean_abs": [sum(d) / len(d) for d in per_seq]}

    golden = {
        "case": case, "torch": torch.__version__, "transformers": transformers.__version__,
        "rope": base.rope_summary(model), "sequences": seqs,
        "scales": {fmt: {"k": [float(t[0]) for t in sc["k"]],
                         "v": [[float(x) for x in t] for t in sc["v"]]} for fmt, sc in scales.items()},
        "variants": variants, "hf_bf16_gap": hf_gap,
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in rec.items() if ".layer0." in k},
              os.path.join(out_dir, "kv.safetensors"))
    base.write_tokenizer_files(out_dir)
    size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
    d = {fmt: max(gap(v, w)[i] for v, w in zip(variants[fmt], variants["fp32"]) for i in range(len(v["logprobs"]) - 1))
         for fmt in variants if fmt != "fp32"}
    return (case, base.rope_summary(model), size, d, hf_gap)


def main():
    torch.manual_seed(0)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}")
    hook = base.Hook()
    hooked = set()
    summary = []
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    failures = []
    for case, cfg_dict in CASES.items():
        try:
            summary.append(run_case(case, cfg_dict, hook, hooked))
        except Exception as e:  # noqa: BLE001  (report every case, fail at the end)
            import traceback
            traceback.print_exc()
            failures.append(f"{case}: {e}")
    total = 0
    for root, _, files in os.walk(OUT):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"{'case':8s} {'bytes':>8s}  max|dlp| vs fp32 (bf16 / e4m3 / e5m2 / hf_bf16)  hf_bf16 mean|dlp|  rope")
    ok = True
    for case, rope, size, d, g in summary:
        print(f"{case:8s} {size:8d}  {d['bf16']:.2e} / {d['fp8_e4m3']:.2e} / {d['fp8_e5m2']:.2e} / "
              f"{d['hf_bf16']:.2e}  {g['mean_abs']:.3e} ({g['device']})  {rope}")
        ok &= size <= CASE_LIMIT
    print(f"total {total} bytes under {OUT}")
    for f in failures:
        print(f"FAILED {f}")
    if failures:
        sys.exit(1)
    if not ok or total > TOTAL_LIMIT:
        print("ERROR: goldens exceed the size limits (1.5 MB per case, 3 MB total)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

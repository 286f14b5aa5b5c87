#!/usr/bin/env python3
"""The HF transformers peer for `fp8kv bench latency` (issue 12 §3): decode
tok/s at batch 1 with a static KV cache and torch.compile, random bf16 weights
built from a config directory alone (no checkpoint needed), on the GPU machine.

    python3 tools/bench_hf_peer.py tests/data/configs/llama-3.1-8b \
        --input-len 1024 --output-len 128 [--json OUT.json]

Method (docs/bench.md): the model is created on the GPU in bf16 with random
normal weights (std 0.02); prompts are random ids; generation is greedy with
EOS ignored (min_new_tokens = max_new_tokens), cache_implementation="static",
and generate()'s own compilation of the decode step (transformers >= 4.48 compiles
it when the cache is static: CompileConfig, mode "reduce-overhead"). Wrapping
model.forward in torch.compile by hand, the older recipe, fails under
transformers 5.17 / torch 2.11 ("accessing tensor output of CUDAGraphs that
has been overwritten", 2026-12-01), so it is not done.
Warm-up generations compile the graphs; then, per timed iteration, a
generate() of 1 new token (the TTFT) and one of output_len tokens; decode
tok/s = (output_len - 1) / (t_full - t_first), medians over iterations.
Bytes per step and floor fraction use fp8kv's definitions (weights streamed
in bf16 + K/V read over the live context; the embedding gathered), with the
device-to-device copy bandwidth measured in the same run. The static cache
actually attends over max_cache_len slots (masked), which the floor ignores.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def copy_bandwidth(nbytes=1 << 30, reps=10):
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2.0 * nbytes / statistics.median(ts)  # read + write


def streamed_weight_bytes(model, batch):
    emb = model.get_input_embeddings().weight
    n = sum(p.numel() for p in model.parameters())  # tied: the LM head is the table, counted once
    tied = model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
    if not tied:
        n -= emb.numel()
    return 2 * (n + batch * emb.shape[1])


def kv_read_bytes(cfg, contexts):
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_tok = 2 * cfg.num_key_value_heads * hd * 2  # K and V, bf16
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    win = getattr(cfg, "sliding_window", None)
    tot = 0
    for t in types:
        for c in contexts:
            tot += min(c, win) if (t == "sliding_attention" and win) else c
    return tot * per_tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config_dir")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-iters-warmup", type=int, default=2)
    ap.add_argument("--num-iters", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="eager (the 8.8 tok/s peer)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result here (also printed)")
    a = ap.parse_args()
    if a.output_len < 2:
        ap.error("--output-len must be >= 2")
    torch.manual_seed(a.seed)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    cfg = AutoConfig.from_pretrained(a.config_dir)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.02)
    model.eval()
    log(f"random weights on the GPU in {time.time() - t0:.1f} s")
    copy_bps = copy_bandwidth()
    ids = torch.randint(0, cfg.vocab_size, (1, a.input_len), device="cuda")
    max_cache_len = a.input_len + a.output_len

    def gen(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             cache_implementation="static" if not a.no_compile else None,
                             cache_config={"max_cache_len": max_cache_len} if not a.no_compile else None,
                             pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == a.input_len + n, out.shape
        return time.perf_counter() - t

    t0 = time.time()
    for _ in range(a.num_iters_warmup):
        gen(1)
        gen(a.output_len)
    log(f"warm-up (compile) {time.time() - t0:.1f} s")
    compiled = getattr(model, "_compiled_call", None) is not None
    log(f"decode step compiled by generate(): {compiled}")
    if not a.no_compile and not compiled:
        log("warning: generate() did not compile the decode step; the result is the static cache eager")
    firsts, fulls = [], []
    for _ in range(a.num_iters):
        firsts.append(gen(1))
        fulls.append(gen(a.output_len))
    ttft = statistics.median(firsts)
    full = statistics.median(fulls)
    step = (full - ttft) / (a.output_len - 1)
    contexts = [a.input_len + i for i in range(1, a.output_len)]
    kv = statistics.mean(kv_read_bytes(cfg, [c]) for c in contexts)
    w = streamed_weight_bytes(model, 1)
    bytes_per_step = w + kv
    r = {
        "peer": "transformers static cache + torch.compile" if not a.no_compile else "transformers eager",
        "decode_step_compiled": compiled,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "config_dir": a.config_dir, "input_len": a.input_len, "output_len": a.output_len, "batch_size": 1,
        "decode_tokens_per_s": (a.output_len - 1) / (full - ttft),
        "output_tokens_per_s": a.output_len / full,
        "total_tokens_per_s": (a.input_len + a.output_len) / full,
        "decode_ms_per_step": 1e3 * step, "ttft_ms": 1e3 * ttft,
        "bytes_per_step": bytes_per_step, "weight_bytes_per_step": w, "kv_bytes_per_step": kv,
        "gbps": bytes_per_step / step / 1e9, "copy_gbps": copy_bps / 1e9,
        "floor_fraction": (bytes_per_step / copy_bps) / step,
    }
    s = json.dumps(r, indent=2)
    print(s)
    if a.json:
        with open(a.json, "w") as f:
            f.write(s + "\n")


if __name__ == "__main__":
    main()

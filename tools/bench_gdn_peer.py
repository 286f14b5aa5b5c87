#!/usr/bin/env python3
"""Peers for bench/cuda/bench_gdn (the Gated DeltaNet delta rule; runs on the GPU machine).

  python3 tools/bench_gdn_peer.py              # JSON lines, one per (implementation, case)

The same cases as bench_gdn: the Qwen3.5-27B linear-attention shape (16 key
heads, 48 value heads, Dk = Dv = 128), one layer, prefill of 1 x 1024,
1 x 8192 and 4 x 2048 rows continuing from a nonzero state (bench_gdn
continues each sequence at position 64). Implementations:

- "transformers_torch": transformers' own torch path,
  torch_chunk_gated_delta_rule of models/qwen3_5 (or models/qwen3_next), what
  Qwen3_5ForCausalLM runs without flash-linear-attention: f32 inside, q and k
  repeated from 16 to 48 heads first (as the model's forward does), l2 norms
  in the rule (use_qk_l2norm_in_kernel=True).
- "fla": flash-linear-attention's Triton chunk_gated_delta_rule (bf16 q, k,
  v; f32 g and beta), when the machine's Python has the `fla` package; else
  one line {"impl": "fla", "skipped": "..."} says it does not.

Inputs are random (q, k, v normal; g = -softplus(a) * exp(A_log) in (-1, 0);
beta in (0, 1)), so the times, not the values, are the point. CUDA events,
3 warm-ups, the median of 5 (bench_gdn's method).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import median_ms  # noqa: E402  (CUDA events, warm-ups, the median)

HK, HV, DK, DV = 16, 48, 128, 128
CASES = [(1, 1024), (1, 8192), (4, 2048)]


def inputs(seqs, rows, dtype):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seqs * 100003 + rows)
    n = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    q, k = n(seqs, rows, HK, DK), n(seqs, rows, HK, DK)
    v = n(seqs, rows, HV, DV)
    a = n(seqs, rows, HV)
    beta = torch.sigmoid(n(seqs, rows, HV))
    gate = -torch.nn.functional.softplus(a) * torch.exp(0.1 * n(HV))
    state = 0.05 * n(seqs, HV, DK, DV)
    return q.to(dtype), k.to(dtype), v.to(dtype), gate, beta, state


def transformers_rule():
    import importlib
    for module in ("qwen3_5.modeling_qwen3_5", "qwen3_next.modeling_qwen3_next"):
        try:
            m = importlib.import_module("transformers.models." + module)
        except ImportError:
            continue
        fn = getattr(m, "torch_chunk_gated_delta_rule", None)
        if fn is not None:
            return module, fn
    return None, None


def emit(d):
    print(json.dumps(d), flush=True)


def main():
    try:
        import torch
    except ImportError:
        sys.exit("bench_gdn_peer.py: no torch")
    if not torch.cuda.is_available():
        sys.exit("bench_gdn_peer.py: torch has no CUDA device")
    rep = HV // HK
    module, rule = transformers_rule()
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_rule
    except ImportError as e:
        fla_rule = None
        emit({"kind": "gdn_peer", "impl": "fla", "skipped": f"flash-linear-attention is not installed ({e})"})
    if rule is None:
        emit({"kind": "gdn_peer", "impl": "transformers_torch",
              "skipped": "transformers has no torch_chunk_gated_delta_rule (models/qwen3_5 or qwen3_next)"})
    # (impl, extra JSON fields, q/k/v dtype, call): one loop over the cases for both.
    impls = []
    if rule is not None:
        impls.append(("transformers_torch", {"module": module}, torch.float32,
                      lambda q, k, v, g, b, s: rule(q, k, v, g=g, beta=b, chunk_size=64, initial_state=s,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)))
    if fla_rule is not None:
        impls.append(("fla", {}, torch.bfloat16,
                      lambda q, k, v, g, b, s: fla_rule(q, k, v, g=g, beta=b, initial_state=s,
                                                        output_final_state=True, use_qk_l2norm_in_kernel=True)))
    for seqs, rows in CASES:
        for impl, extra, dtype, call in impls:
            q, k, v, gate, beta, state = inputs(seqs, rows, dtype)
            q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
            with torch.no_grad():
                ms = median_ms(lambda _: call(q, k, v, gate, beta, state), 3, 5)
            emit({"kind": "gdn_peer", "impl": impl, **extra, "seqs": seqs, "rows": rows, "us": ms * 1e3,
                  "tok_per_s": seqs * rows / (ms * 1e-3)})
            del q, k, v, gate, beta, state
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

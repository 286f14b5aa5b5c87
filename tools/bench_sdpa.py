#!/usr/bin/env python3
"""PyTorch peer for bench/cuda/bench_attention (runs on the GPU machine).

  python3 tools/bench_sdpa.py                 # JSON lines: sdpa decode/prefill, cuBLAS bf16 GEMM
  python3 tools/bench_sdpa.py --prefill-only  # the GEMM and the 8K causal prefill row only
  python3 tools/bench_sdpa.py --decode-fresh 32,8,128,64,4096 ...  # decode rows, each in a fresh CUDA context

scripts/gpu.sh kernels runs it beside bench_attention (tools/ab_table.py makes the table).

Decode: F.scaled_dot_product_attention(q[B,32,1,128], k/v[B,8,C,128] bf16,
contiguous, enable_gqa=True), and Gemma-3-12B's q[B,16,1,256], k/v[B,8,C,256];
prefill: 8K causal, Llama heads. Working sets are
rotated among copies to stay well past the 60 MB L2; CUDA events, warm-up,
medians (same method as the C++ bench).
"""
import json
import sys

H, HKV, D = 32, 8, 128


def median_ms(fn, warmup, reps):
    import torch
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn(warmup + i)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def stream_median_ms(fn, first, reps):
    """Stream method (docs/cuda.md, "Decode v11"), as bench_attention's: the
    per-call GPU time of calls issued back to back behind a spin
    (torch.cuda._sleep), events around each call and no host sync between
    them, so no call waits for its own host-side launch (Python and the
    dispatcher). Returns (median ms, mean host us per call)."""
    import time
    import torch
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    # ~2 ms + 200 us per call at ~2 GHz: every call is queued before the GPU gets there.
    torch.cuda._sleep(int((2e-3 + 2e-4 * reps) * 2e9))
    h0 = time.perf_counter()
    ev[0].record()
    for i in range(reps):
        fn(first + i)
        ev[i + 1].record()
    h1 = time.perf_counter()
    ev[reps].synchronize()
    ts = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(reps))
    return ts[len(ts) // 2], (h1 - h0) / reps * 1e6


def run(prefill_only=False):
    import torch
    import torch.nn.functional as F
    dev = "cuda"
    torch.manual_seed(0)
    print(json.dumps({"kind": "env", "torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    # cuBLAS bf16 GEMM ceiling.
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    ms = median_ms(lambda i: a @ b, 3, 10)
    print(json.dumps({"kind": "gemm", "n": n, "ms": ms, "TFLOPs": 2 * n**3 / (ms * 1e-3) / 1e12}), flush=True)
    del a, b
    # Prefill 8K causal (twice in --prefill-only mode: the first warms up clocks).
    S = 8192
    q = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, HKV, S, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, HKV, S, D, device=dev, dtype=torch.bfloat16)
    ms = median_ms(lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 3, 20)
    flops = 4.0 * H * D * (S * (S + 1) / 2)
    print(json.dumps({"kind": "sdpa_prefill", "seq": S, "ms": ms, "TFLOPs": flops / (ms * 1e-3) / 1e12}), flush=True)
    del q, k, v
    if prefill_only:
        return
    # Decode.
    shapes = [(H, HKV, D, B, C) for B in (1, 8, 32, 64) for C in (1024, 4096, 16384, 65536)]
    shapes += [(16, 8, 256, B, C) for B in (1, 8, 32) for C in (16384, 65536)]
    for shape in shapes:
        decode_row(*shape)


def decode_row(h, hkv, d, B, C):
    import torch
    import torch.nn.functional as F
    dev = "cuda"
    kv_bytes = 2 * B * C * hkv * d * 2
    copies = max(1, min(64, -(-(1 << 30) // kv_bytes)))
    ks = [torch.randn(B, hkv, C, d, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn(B, hkv, C, d, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    q = torch.randn(B, h, 1, d, device=dev, dtype=torch.bfloat16)
    reps = 10 if kv_bytes > 4e9 else 30
    fn = lambda i: F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
    # Warm-up of >= FP8KV_BENCH_WARMUP_MS (default 150) ms of this very call
    # before timing, as bench_attention's decode rows (docs/cuda.md, decode v8).
    import os
    import time
    warm_s = float(os.environ.get("FP8KV_BENCH_WARMUP_MS") or 150) / 1e3
    t0, i = time.perf_counter(), 0
    while True:
        for _ in range(8):
            fn(i)
            i += 1
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= warm_s:
            break
    ms = median_ms(fn, 3, reps)
    ms_stream, host_us = stream_median_ms(fn, 3 + reps, reps)
    print(json.dumps({"kind": "sdpa_decode", "d": d, "heads": h, "batch": B, "ctx": C, "ms": ms,
                      "kv_bytes": kv_bytes, "GBps": kv_bytes / (ms * 1e-3) / 1e9, "ms_stream": ms_stream,
                      "host_us": host_us}), flush=True)
    del ks, vs, q
    torch.cuda.empty_cache()


def decode_fresh(shapes):
    """Each decode row in a fresh CUDA context (docs/cuda.md, "Decode v8"):
    torch is imported once here (CUDA stays uninitialised in this process),
    then every row runs in a forked child that initialises CUDA, allocates,
    measures and exits, so no row sees the allocations an earlier one left,
    the same treatment scripts/gpu.sh gives bench_attention's rows (one
    process per row)."""
    import os
    import torch
    assert not torch.cuda.is_initialized()
    for shape in shapes:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                decode_row(*shape)
            except Exception as e:  # a failed row is reported, the others still run
                print(json.dumps({"kind": "sdpa_error", "shape": list(shape), "error": str(e)}), flush=True)
                code = 1
            sys.stdout.flush()
            os._exit(code)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--decode-fresh":
        # --decode-fresh "H,HKV,D,B,C" ...: those decode rows, each in a fresh CUDA context.
        try:
            rows = [tuple(int(x) for x in a.split(",")) for a in sys.argv[2:]]
            if not rows or any(len(r) != 5 or min(r) <= 0 for r in rows):
                raise ValueError
        except ValueError:
            sys.exit("bench_sdpa.py --decode-fresh: arguments are H,HKV,D,B,C (positive integers)")
        decode_fresh(rows)
    else:
        run(prefill_only="--prefill-only" in sys.argv[1:])

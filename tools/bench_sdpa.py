#!/usr/bin/env python3
"""PyTorch peer for bench/cuda/bench_attention (runs on the GPU machine).

  python3 tools/bench_sdpa.py                 # JSON lines: sdpa decode/prefill, cuBLAS bf16 GEMM
  python3 tools/bench_sdpa.py --prefill-only  # only the 8K causal prefill row (scripts/gpu_prefill.sh)
  python3 tools/bench_sdpa.py --decode-fresh 32,8,128,64,4096 ...  # decode rows, each in a fresh CUDA context
  python3 tools/bench_sdpa.py --table OURS.jsonl SDPA.jsonl [BASE.jsonl]   # the summary table

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
    the same treatment scripts/gpu_decode.sh gives bench_attention's rows (one
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


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def table(ours_path, sdpa_path, base_path=None, base_label="base"):
    ours, sdpa = load(ours_path), load(sdpa_path)
    base = load(base_path) if base_path else []
    copy = next((r["GBps"] for r in ours if r["kind"] == "copy"), float("nan"))
    sd = {(r.get("d", 128), r["batch"], r["ctx"]): r for r in sdpa if r["kind"] == "sdpa_decode"}
    dec = {(r["dtype"], r.get("d", 128), r["batch"], r["ctx"]): r for r in ours if r["kind"] == "decode"}
    bdec = {(r["dtype"], r.get("d", 128), r["batch"], r["ctx"]): r for r in base if r["kind"] == "decode"}
    print(f"copy D2D (read+write): {copy:.0f} GB/s")
    for r in sdpa:
        if r["kind"] == "gemm":
            print(f"cuBLAS bf16 GEMM 8192^3: {r['TFLOPs']:.0f} TFLOP/s")
    print("decode (d128: 32/8 heads, d256: 16/8 heads), times in us; GB/s = KV bytes / time; "
          f"{base_label} = " + ("the previous kernels" if base_label == "base" else "the FP8KV_DECODE_DEEP=1 variant")
          + " in the same run")
    print(f"{'d':>3} {'B':>3} {'ctx':>6} | {'sdpa':>8} | {'bf16':>8} {'GB/s':>6} {'x sdpa':>6} | {'fp8':>8} {'GB/s':>6} "
          f"{'%copy':>6} {'t/sdpa':>6} {'fp8/bf16':>8} | {base_label + ' fp8':>8} {base_label + ' bf16':>9}")
    for (d, B, C), s in sorted(sd.items()):
        b = dec.get(("bf16", d, B, C))
        e = dec.get(("fp8_e4m3", d, B, C))
        if not b or not e:
            continue
        be = bdec.get(("fp8_e4m3", d, B, C))
        bb = bdec.get(("bf16", d, B, C))
        bs = (f"{be['ms']*1e3:8.1f} {bb['ms']*1e3:9.1f}") if be and bb else f"{'-':>8} {'-':>9}"
        print(f"{d:>3} {B:>3} {C:>6} | {s['ms']*1e3:8.1f} | {b['ms']*1e3:8.1f} {b['GBps']:6.0f} {s['ms']/b['ms']:6.2f} | "
              f"{e['ms']*1e3:8.1f} {e['GBps']:6.0f} {100*e['GBps']/copy:6.1f} {e['ms']/s['ms']:6.2f} "
              f"{e['ms']/b['ms']:8.2f} | {bs}")
    sp = [r for r in ours if r["kind"] == "split"]
    if sp:
        print("fp8 d128 decode at forced split sizes (us):")
        for B, C in sorted({(r["batch"], r["ctx"]) for r in sp}):
            auto = dec.get(("fp8_e4m3", 128, B, C))
            cells = " ".join(f"{r['split_tokens']}:{r['ms']*1e3:.1f}" for r in sp if (r["batch"], r["ctx"]) == (B, C))
            a = f" auto({auto['split_tokens']}):{auto['ms']*1e3:.1f}" if auto else ""
            print(f"  B={B} ctx={C}: {cells}{a}")
    pl = [r for r in ours if r["kind"] == "plan"]
    if pl:
        print("auto plan at assumed CTAs per SM (us, splits; 'occ' = the default, the occupancy API; "
              "%copy and t/sdpa of the best):")
        for dt, d, B, C in sorted({(r["dtype"], r.get("d", 128), r["batch"], r["ctx"]) for r in pl}):
            rows = [r for r in pl if (r["dtype"], r.get("d", 128), r["batch"], r["ctx"]) == (dt, d, B, C)]
            auto = dec.get((dt, d, B, C))
            if auto:
                rows.append(dict(auto, ctas_per_sm="occ"))
            cells = " ".join(f"{r['ctas_per_sm']}:{r['ms']*1e3:.1f}({r['splits']})" for r in rows)
            best = min(rows, key=lambda r: r["ms"])
            s = sd.get((d, B, C))
            ts = f" t/sdpa {best['ms']/s['ms']:.2f}" if s else ""
            print(f"  {dt} d{d} B={B} ctx={C}: {cells} | best {best['ctas_per_sm']}: "
                  f"{100*best['GBps']/copy:.1f}% copy{ts}")
    spf = next((r for r in sdpa if r["kind"] == "sdpa_prefill"), None)
    for r in ours:
        if r["kind"] == "prefill":
            extra = f", {r['TFLOPs']/spf['TFLOPs']:.2f}x SDPA bf16 ({spf['TFLOPs']:.0f})" if spf else ""
            kern = f" [{r['kernel']}]" if "kernel" in r else ""
            print(f"prefill 8K causal {r['dtype']}{kern}: {r['ms']:.3f} ms, {r['TFLOPs']:.0f} TFLOP/s{extra}")
    for label, rows in (("", ours), ("base ", base)):
        st = {r["dtype"]: r for r in rows if r["kind"] == "store"}
        if "bf16" in st and "fp8_e4m3" in st:
            print(f"{label}store 64K tokens: bf16 {st['bf16']['ms']*1e3:.1f} us ({100*st['bf16']['GBps']/copy:.0f}% copy), "
                  f"fp8 {st['fp8_e4m3']['ms']*1e3:.1f} us ({100*st['fp8_e4m3']['GBps']/copy:.0f}% copy) "
                  f"(fp8/bf16 {st['fp8_e4m3']['ms']/st['bf16']['ms']:.3f})")


if __name__ == "__main__":
    if len(sys.argv) in (4, 5, 6) and sys.argv[1] == "--table":
        table(*sys.argv[2:])
    elif len(sys.argv) >= 2 and sys.argv[1] == "--decode-fresh":
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

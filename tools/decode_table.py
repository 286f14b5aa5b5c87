#!/usr/bin/env python3
"""Decode table of scripts/gpu_decode.sh against issue 14's targets.

  python3 tools/decode_table.py OUTDIR

Reads OUTDIR/bench_base.jsonl (bench_attention `shape`, one process per row:
a copy line and a decode line each), OUTDIR/bench_d256ring.jsonl (fp8 D = 256
on the cp.async ring), OUTDIR/bench_wide.jsonl (FP8KV_DECODE_REDUCE=wide),
OUTDIR/sdpa.jsonl (PyTorch SDPA bf16, a fresh CUDA
context per row), OUTDIR/test_base.status, OUTDIR/probe.jsonl and
OUTDIR/sass.txt, and decode v9's OUTDIR/bench_ab_{base,v9}.jsonl (A/B rows)
and OUTDIR/bench_splits.jsonl (forced splits). Copy bandwidth: the median of the per-process copies.
x = SDPA time / ours (bf16 goal >= 0.95); t = ours / SDPA (fp8 goal <= 0.55
at B >= 8, ctx >= 16K); %copy = KV bytes / time / copy bandwidth.
"""
import json
import os
import statistics
import sys


def load(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    return rows


def main():
    out = sys.argv[1]
    base = load(os.path.join(out, "bench_base.jsonl"))
    ring = load(os.path.join(out, "bench_d256ring.jsonl"))
    ab_all = [r for n in ("base", "v9", "ring") for r in load(os.path.join(out, f"bench_ab_{n}.jsonl"))]
    copies = [r["GBps"] for r in base + ring if r["kind"] == "copy"] or [r["GBps"] for r in ab_all if r["kind"] == "copy"]
    copy = statistics.median(copies) if copies else float("nan")
    sdpa = {(r["d"], r["batch"], r["ctx"]): r["ms"] for r in load(os.path.join(out, "sdpa.jsonl"))
            if r["kind"] == "sdpa_decode"}
    ours = {(r["dtype"], r["d"], r["batch"], r["ctx"]): r for r in base if r["kind"] == "decode"}
    rng = {(r["dtype"], r["d"], r["batch"], r["ctx"]): r for r in ring if r["kind"] == "decode"}
    st = os.path.join(out, "test_base.status")
    status = open(st).read().strip() if os.path.exists(st) else "?"
    print(f"decode, every row in a fresh process (ours) / fresh CUDA context (SDPA); copy D2D {copy:.0f} GB/s "
          f"(median of {len(copies)}, {min(copies, default=0):.0f}-{max(copies, default=0):.0f}); decode tests {status}")
    print("times in us; x = SDPA / ours (bf16 >= 0.95); t = ours / SDPA (fp8 <= 0.55 at B >= 8, ctx >= 16K)")
    print(f"{'d':>3} {'B':>3} {'ctx':>6} | {'sdpa':>7} | {'bf16':>7} {'x':>5} {'%copy':>5} | {'fp8':>7} {'t':>5} "
          f"{'%copy':>5} {'spl':>3} | {'ring fp8':>8} {'t':>5}")
    keys = sorted({k[1:] for k in ours} | set(sdpa))
    bf_min, fp_t = {}, {}
    for d, B, C in keys:
        s = sdpa.get((d, B, C))
        b, e, g = ours.get(("bf16", d, B, C)), ours.get(("fp8_e4m3", d, B, C)), rng.get(("fp8_e4m3", d, B, C))
        f = lambda v, w, p=1: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"
        us = lambda r: r["ms"] * 1e3 if r else None
        pc = lambda r: 100 * r["GBps"] / copy if r else None
        x = s / b["ms"] if (s and b) else None
        t = e["ms"] / s if (s and e) else None
        tg = g["ms"] / s if (s and g) else None
        if x is not None:
            bf_min.setdefault(d, []).append((x, B, C))
        if t is not None and B >= 8 and C >= 16384:
            fp_t.setdefault(d, []).append((t, B, C))
        print(f"{d:>3} {B:>3} {C:>6} | {f(s * 1e3 if s else None, 7)} | {f(us(b), 7)} {f(x, 5, 2)} {f(pc(b), 5)} | "
              f"{f(us(e), 7)} {f(t, 5, 2)} {f(pc(e), 5)} {e['splits'] if e else '-':>3} | {f(us(g), 8)} {f(tg, 5, 2)}")
    def line(name, val, goal, ok):
        v = "no data" if val is None else val
        print(f"  {name:<44} {v:<26} goal {goal:<8} {'MET' if ok else ('-' if val is None else 'missed')}")

    def targets(title, bf, fp, pct):
        """Issue 14's targets: bf / fp the (x, B, C) / (t, B, C) lists per d,
        pct(row) the row's % of copy (None without data); one method each."""
        print(title)
        for d in (128, 256):
            m = min(bf.get(d, []), default=None)
            line(f"bf16 d{d} min x SDPA (every size)", m and f"{m[0]:.3f} (B={m[1]}/{m[2]})", ">= 0.95",
                 m and m[0] >= 0.95)
            w = max(fp.get(d, []), default=None)
            line(f"fp8 d{d} max t/SDPA (B >= 8, ctx >= 16K)", w and f"{w[0]:.3f} (B={w[1]}/{w[2]})", "<= 0.55",
                 w and w[0] <= 0.55)
            for B, C, goal in ((32, 16384, 90), (1, 65536, 65)):
                v = pct(ours.get(("fp8_e4m3", d, B, C)))
                line(f"fp8 d{d} B={B}/{C // 1024}K % of copy", v is not None and f"{v:.1f}" or None, f">= {goal}",
                     v is not None and v >= goal)

    targets("targets (issue 14):", bf_min, fp_t, lambda r: 100 * r["GBps"] / copy if r else None)
    # The read-only ceiling (decode v12, OUTDIR/read.jsonl when the run has it):
    # a kernel that only streams reads, as decode does, beside the copy.
    for r in load(os.path.join(out, "read.jsonl")):
        if r.get("kind") == "read":
            print(f"read-only streaming kernel: {r['GBps']:.0f} GB/s ({100 * r['GBps'] / copy:.1f}% of copy), "
                  f"stream method {r.get('GBps_stream', float('nan')):.0f} GB/s")
    # The stream method (decode v11; bench_attention and bench_sdpa's
    # ms_stream): the same rows' per-call GPU time of calls issued back to back
    # (no host launch in the time), %copy against the copy by the same method.
    cs_ = [r["GBps_stream"] for r in base if r["kind"] == "copy" and r.get("GBps_stream")]
    copy_s = statistics.median(cs_) if cs_ else None
    sdpa_s = {(r["d"], r["batch"], r["ctx"]): r["ms_stream"] for r in load(os.path.join(out, "sdpa.jsonl"))
              if r["kind"] == "sdpa_decode" and r.get("ms_stream")}
    if copy_s and sdpa_s and any(r.get("ms_stream") for r in ours.values()):
        print(f"stream method (calls back to back behind a spin: GPU time per call, no host launch in it; copy "
              f"{copy_s:.0f} GB/s by the same method; host = ours' host us per call)")
        print(f"{'d':>3} {'B':>3} {'ctx':>6} | {'sdpa':>7} | {'bf16':>7} {'x':>5} {'%copy':>5} | {'fp8':>7} {'t':>5} "
              f"{'%copy':>5} {'host':>5}")
        bf_s, fp_s = {}, {}
        f = lambda v, w, p=1: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"
        ms_ = lambda r: r.get("ms_stream") if r else None
        pc = lambda r: 100 * r["kv_bytes"] / (r["ms_stream"] * 1e-3) / 1e9 / copy_s if ms_(r) else None
        for d, B, C in keys:
            s = sdpa_s.get((d, B, C))
            b, e = ours.get(("bf16", d, B, C)), ours.get(("fp8_e4m3", d, B, C))
            x = s / ms_(b) if (s and ms_(b)) else None
            t = ms_(e) / s if (s and ms_(e)) else None
            if x is not None:
                bf_s.setdefault(d, []).append((x, B, C))
            if t is not None and B >= 8 and C >= 16384:
                fp_s.setdefault(d, []).append((t, B, C))
            print(f"{d:>3} {B:>3} {C:>6} | {f(s * 1e3 if s else None, 7)} | {f(ms_(b) and ms_(b) * 1e3, 7)} "
                  f"{f(x, 5, 2)} {f(pc(b), 5)} | {f(ms_(e) and ms_(e) * 1e3, 7)} {f(t, 5, 2)} {f(pc(e), 5)} "
                  f"{f(e and e.get('host_us'), 5)}")
        targets("targets (issue 14), stream method:", bf_s, fp_s, pc)
    # A/B (version 9: FP8KV_DECODE_V9 values; version 10: fuse =
    # FP8KV_DECODE_FUSE=1): base and the variants interleaved per row, each in
    # a fresh process; the base rows above are another sample of the default.
    key = lambda r: (r["dtype"], r["d"], r["batch"], r["ctx"])
    abb = {key(r): r for r in load(os.path.join(out, "bench_ab_base.jsonl")) if r["kind"] == "decode"}
    # Every other bench_ab_NAME.jsonl is a variant (v9 = FP8KV_DECODE_V9=1, ring
    # = FP8KV_DECODE_V9=ring, old = FP8KV_DECODE_V9=0 once a variant is the default).
    names = sorted(f[len("bench_ab_"):-len(".jsonl")] for f in os.listdir(out)
                   if f.startswith("bench_ab_") and f.endswith(".jsonl") and f != "bench_ab_base.jsonl")
    names.sort(key=lambda n: {"v9": 0, "old": 1, "ring": 2}.get(n, 3))
    var = {n: {key(r): r for r in load(os.path.join(out, f"bench_ab_{n}.jsonl")) if r["kind"] == "decode"}
           for n in names}
    var = {n: v for n, v in var.items() if v}
    if var:
        st = lambda n: open(os.path.join(out, f"test_{n}.status")).read().strip() if os.path.exists(
            os.path.join(out, f"test_{n}.status")) else "not run here"
        print("A/B (us; speed = mean(default samples) / variant; %copy and t = us / SDPA (fp8) or x = SDPA / us (bf16) "
              "per column): " + "; ".join(f"{n} decode tests {st(n)}" for n in var))
        print("  (s.speed: the same ratio by the stream method's GPU times, ms_stream, where the rows have them)")
        print(f"  {'row':<22} {'base':>7} {'base2':>7} {'%copy':>6} {'t/x':>6}" + "".join(
            f" | {n:>7} {'speed':>6} {'s.speed':>7} {'%copy':>6} {'t/x':>6}" for n in var))
        allk = sorted({k for v in var.values() for k in v} | set(abb), key=lambda k: (k[1], k[0], k[2], k[3]))
        fm = lambda v, w, p=1: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"
        rel = lambda k, r: ((r["ms"] / sdpa[k[1:]] if k[0] != "bf16" else sdpa[k[1:]] / r["ms"])
                            if r and k[1:] in sdpa else None)
        for k in allk:
            b1, b2 = ours.get(k), abb.get(k)
            bs = [r["ms"] for r in (b1, b2) if r]
            bref = b2 or b1
            name = f"{k[0][:4]} d{k[1]} B={k[2]}/{k[3] // 1024}K"
            line = (f"  {name:<22} {fm(b1 and b1['ms'] * 1e3, 7)} {fm(b2 and b2['ms'] * 1e3, 7)} "
                    f"{fm(bref and 100 * bref['GBps'] / copy, 6)} {fm(rel(k, bref), 6, 3)}")
            bss = [r["ms_stream"] for r in (b1, b2) if r and r.get("ms_stream")]
            for n, v in var.items():
                r = v.get(k)
                sp = statistics.mean(bs) / r["ms"] if (r and bs) else None
                ssp = statistics.mean(bss) / r["ms_stream"] if (r and bss and r.get("ms_stream")) else None
                line += (f" | {fm(r and r['ms'] * 1e3, 7)} {fm(sp, 6, 3)} {fm(ssp, 7, 3)} "
                         f"{fm(r and 100 * r['GBps'] / copy, 6)} {fm(rel(k, r), 6, 3)}")
            print(line)
    # Forced-split rows (decode v10): bench_split_base.jsonl and
    # bench_split_NAME.jsonl (the ALT variants), interleaved per row.
    sb = [r for r in load(os.path.join(out, "bench_split_base.jsonl")) if r["kind"] == "split"]
    if sb:
        skey = lambda r: (r["dtype"], r["d"], r["batch"], r["ctx"], r["split_tokens"])
        snames = sorted(f[len("bench_split_"):-len(".jsonl")] for f in os.listdir(out)
                        if f.startswith("bench_split_") and f.endswith(".jsonl") and f != "bench_split_base.jsonl")
        sv = {n: {skey(r): r for r in load(os.path.join(out, f"bench_split_{n}.jsonl")) if r["kind"] == "split"}
              for n in snames}
        autos = {k: r for k, r in ours.items()}
        for k, r in abb.items():
            autos.setdefault(k, r)
        print("forced splits (us, %copy; auto = the A/B default row's plan): " + " | ".join(["base"] + snames))
        for r in sb:
            k = skey(r)
            a = autos.get(k[:4])
            line = (f"  {k[0][:4]} d{k[1]} B={k[2]}/{k[3] // 1024}K {r['splits']:>3} x {k[4]:>5}: "
                    f"{r['ms'] * 1e3:7.1f} {100 * r['GBps'] / copy:5.1f}%"
                    + (f" stream {r['ms_stream'] * 1e3:7.1f}" if r.get("ms_stream") else ""))
            for n in snames:
                v = sv[n].get(k)
                line += f" | {n} {v['ms'] * 1e3:7.1f} {100 * v['GBps'] / copy:5.1f}%" if v else f" | {n} -"
            if a:
                line += f"   (auto {a['splits']} splits {a['ms'] * 1e3:.1f}" + (
                    f", stream {a['ms_stream'] * 1e3:.1f})" if a.get("ms_stream") else ")")
            print(line)
    spl = [r for r in load(os.path.join(out, "bench_splits.jsonl")) if r["kind"] == "split"]
    if spl:
        b = ours.get(("fp8_e4m3", 128, 32, 16384))
        print("fp8 d128 B=32/16K by split (default kernel; auto plan "
              + (f"{b['splits']} splits {b['ms'] * 1e3:.1f} us" if b else "-") + "): " + "; ".join(
                  f"{r['splits']} x {r['split_tokens']} {r['ms'] * 1e3:.1f} us ({100 * r['GBps'] / copy:.1f}%)"
                  for r in spl))
    probe = load(os.path.join(out, "probe.jsonl"))
    if probe:
        print("order probe (one process, bf16 d128): " + "; ".join(
            f"B={r['batch']}/{r['ctx']} {r['ms'] * 1e3:.1f}" for r in probe if r["kind"] == "probe"))
        fresh = {(r["batch"], r["ctx"]): r["ms"] * 1e3 for k, r in ours.items() if k[0] == "bf16" and k[1] == 128}
        print("  (fresh-process rows above: " + ", ".join(
            f"B={B}/{C} {fresh[(B, C)]:.1f}" for B, C in ((64, 4096), (32, 4096), (64, 1024)) if (B, C) in fresh) + ")")
    sts = sorted(f for f in os.listdir(out) if f.startswith("test_") and f.endswith(".status"))
    if sts:
        print("decode tests: " + "; ".join(
            f"{f[len('test_'):-len('.status')]} {open(os.path.join(out, f)).read().strip()}" for f in sts))
    sp = os.path.join(out, "sass.txt")
    if os.path.exists(sp):
        lines = [l for l in open(sp).read().splitlines() if l.strip()]
        bad = [l for l in lines if "LDL/STL=" in l and not l.endswith("LDL/STL=0")]
        print(f"SASS: {len(lines)} decode kernels, " + (f"spills in {len(bad)}: {bad[:3]}" if bad else "no LDL/STL"))


if __name__ == "__main__":
    main()

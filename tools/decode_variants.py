#!/usr/bin/env python3
"""Summary table of the decode-kernel variants that scripts/gpu_decode.sh ran.

  python3 tools/decode_variants.py OUTDIR NAME1 NAME2 ...

Reads OUTDIR/bench_NAME.jsonl (bench_attention decode128 under each
variant's environment), OUTDIR/test_NAME.status (PASS/FAIL of the decode
tests under it), OUTDIR/sdpa.jsonl (PyTorch SDPA bf16, the peer) and
OUTDIR/ncu_*.txt (Nsight Compute, optional). Prints per shape the time of
every variant, the issue-14 ratios of the best, and per variant the targets.
"""
import json
import os
import re
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
    out, names = sys.argv[1], sys.argv[2:]
    sdpa = {(r.get("d", 128), r["batch"], r["ctx"]): r["ms"] for r in load(os.path.join(out, "sdpa.jsonl"))
            if r["kind"] == "sdpa_decode"}
    copy = float("nan")
    var = {}
    for n in names:
        rows = load(os.path.join(out, f"bench_{n}.jsonl"))
        for r in rows:
            if r["kind"] == "copy":
                copy = r["GBps"] if copy != copy else copy
        var[n] = {(r["dtype"], r.get("d", 128), r["batch"], r["ctx"]): r for r in rows if r["kind"] == "decode"}
    status = {}
    for n in names:
        p = os.path.join(out, f"test_{n}.status")
        status[n] = open(p).read().strip() if os.path.exists(p) else "?"
    print(f"copy D2D {copy:.0f} GB/s; times in us (d128, 32/8 heads); x = SDPA time / ours (bf16 goal >= 0.95), "
          "t = ours / SDPA (fp8 goal <= 0.55 at B >= 8, ctx >= 16K)")
    print("variants: " + ", ".join(f"{n} (decode tests {status[n]})" for n in names))
    hdr = f"{'d':>3} {'dtype':>8} {'B':>3} {'ctx':>6} | {'sdpa':>7} | " + " ".join(f"{n[:11]:>11}" for n in names) + " | best"
    print(hdr)
    keys = sorted({k for v in var.values() for k in v}, key=lambda k: (k[1], k[0] != "bf16", k[2], k[3]))
    summary = {n: {"bf16_min_x": 9.0, "fp8_max_t": 0.0, "b1_64k": None, "b32_16k": None, "n": 0} for n in names}
    for k in keys:
        dt, d, B, C = k
        s = sdpa.get((d, B, C))
        cells = []
        best = None
        for n in names:
            r = var[n].get(k)
            if not r:
                cells.append(f"{'-':>11}")
                continue
            us = r["ms"] * 1e3
            ratio = ""
            if s:
                ratio = f"{s / r['ms']:.2f}x" if dt == "bf16" else f"{r['ms'] / s:.2f}t"
            cells.append(f"{us:6.1f} {ratio:>4}" if ratio else f"{us:11.1f}")
            if status[n] == "PASS" and (best is None or r["ms"] < best[1]["ms"]):
                best = (n, r)
            sm = summary[n]
            if d != 128:
                continue
            sm["n"] += 1
            if s and dt == "bf16":
                sm["bf16_min_x"] = min(sm["bf16_min_x"], s / r["ms"])
            if s and dt == "fp8_e4m3" and B >= 8 and C >= 16384:
                sm["fp8_max_t"] = max(sm["fp8_max_t"], r["ms"] / s)
            if dt == "fp8_e4m3" and (B, C) == (1, 65536):
                sm["b1_64k"] = 100 * r["GBps"] / copy
            if dt == "fp8_e4m3" and (B, C) == (32, 16384):
                sm["b32_16k"] = 100 * r["GBps"] / copy
        b = f"{best[0]} ({100 * best[1]['GBps'] / copy:.1f}% copy)" if best else "-"
        print(f"{d:>3} {dt[:8]:>8} {B:>3} {C:>6} | {s * 1e3 if s else float('nan'):7.1f} | " + " ".join(cells) + f" | {b}")
    print("targets per variant (d128): bf16 min x SDPA (>= 0.95) | fp8 max t/SDPA at B >= 8, ctx >= 16K (<= 0.55) | "
          "fp8 %copy B=1/64K (>= 65) | B=32/16K (>= 90) | decode tests")
    for n in names:
        sm = summary[n]
        if sm["n"] == 0:
            print(f"  {n:>14}: no data")
            continue
        f = lambda v: f"{v:.1f}" if v is not None else "-"
        print(f"  {n:>14}: {sm['bf16_min_x']:.2f} | {sm['fp8_max_t']:.2f} | {f(sm['b1_64k'])} | {f(sm['b32_16k'])} | "
              f"{status[n]}")
    # D = 256 (Gemma-3-12B shape, 16/8 heads), fp8 e4m3, same targets.
    d256 = [k for k in keys if k[1] == 256 and k[0] == "fp8_e4m3"]
    if d256:
        print("targets per variant (d256 fp8): max t/SDPA at B >= 8, ctx >= 16K (<= 0.55) | %copy B=1/64K (>= 65) | "
              "B=32/16K (>= 90)")
        for n in names:
            ts, b1, b32 = [], None, None
            for k in d256:
                r = var[n].get(k)
                s = sdpa.get((256, k[2], k[3]))
                if not r:
                    continue
                if s and k[2] >= 8 and k[3] >= 16384:
                    ts.append(r["ms"] / s)
                if (k[2], k[3]) == (1, 65536):
                    b1 = 100 * r["GBps"] / copy
                if (k[2], k[3]) == (32, 16384):
                    b32 = 100 * r["GBps"] / copy
            if ts or b1 is not None:
                f = lambda v: f"{v:.1f}" if v is not None else "-"
                print(f"  {n:>14}: {max(ts) if ts else float('nan'):.2f} | {f(b1)} | {f(b32)}")
    # Per dtype: each variant against base over the d128 rows (geometric mean
    # of base time / variant time; the worst and best rows).
    if "base" in var:
        print("vs base (d128): geo-mean speed-up, worst row, best row")
        for dt in ("bf16", "fp8_e4m3"):
            for n in names:
                if n == "base":
                    continue
                rs = []
                for k, r in var[n].items():
                    b = var["base"].get(k)
                    if b and k[0] == dt and k[1] == 128:
                        rs.append((b["ms"] / r["ms"], k))
                if not rs:
                    continue
                g = 1.0
                for x, _ in rs:
                    g *= x
                g **= 1.0 / len(rs)
                lo, hi = min(rs), max(rs)
                print(f"  {dt:>8} {n:>14}: {g:.3f} (worst {lo[0]:.3f} at B={lo[1][2]}/{lo[1][3]}, "
                      f"best {hi[0]:.3f} at B={hi[1][2]}/{hi[1][3]}) tests {status[n]}")
    # Nsight Compute: a few lines per profiled kernel.
    pat = re.compile(r"^\s*(Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Achieved Occupancy|"
                     r"Theoretical Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction|"
                     r"Block Limit Registers|Waves Per SM)\s")
    stall = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio\s+(\S+)\s+([\d.,]+)")
    for fn in sorted(os.listdir(out)):
        if not (fn.startswith("ncu_") and fn.endswith(".txt")):
            continue
        txt = open(os.path.join(out, fn), errors="replace").read()
        # Only the decode kernel's report (the first one).
        lines = []
        seen = set()
        for line in txt.splitlines():
            m = pat.match(line)
            if m and m.group(1) not in seen:
                seen.add(m.group(1))
                lines.append(re.sub(r"\s+", " ", line.strip()))
        st = sorted(((float(v.replace(",", "")), k) for k, _, v in stall.findall(txt)), reverse=True)[:5]
        print(f"ncu {fn[4:-4]}: " + "; ".join(lines))
        if st:
            print("    top stalls (cycles per issued instr): " + ", ".join(f"{k} {v:.2f}" for v, k in st))


if __name__ == "__main__":
    main()

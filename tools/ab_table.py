#!/usr/bin/env python3
"""Speed of variants over a base, from interleaved bench_attention rows.

  python3 tools/ab_table.py OUTDIR BASE VARIANT [VARIANT ...]

Reads OUTDIR/ab_NAME.jsonl (bench_attention `shape` lines, several samples
per row, written by scripts/gpu_ab.sh) and prints per row the base's median
time (isolated call / stream method, us) and each variant's speed over it
(base median / variant median, both methods), then the geometric mean of
the speeds over the rows (docs/design.md "Performance method").
"""
import collections
import json
import math
import statistics
import sys


def load(path):
    rows = collections.defaultdict(lambda: ([], []))
    try:
        with open(path) as f:
            for line in f:
                j = json.loads(line)
                if j.get("kind") != "decode":
                    continue
                k = (j["dtype"], j["d"], j["batch"], j["ctx"])
                rows[k][0].append(j["ms"] * 1000)
                rows[k][1].append(j["ms_stream"] * 1000)
    except FileNotFoundError:
        pass
    return rows


def main(out, base, variants):
    b = load(f"{out}/ab_{base}.jsonl")
    vs = {n: load(f"{out}/ab_{n}.jsonl") for n in variants}
    logs = {n: ([], []) for n in variants}
    print(f"row: {base} median us (isolated / stream), then each variant's speed over it (isolated / stream)")
    for k, (iso, st) in sorted(b.items()):
        bi, bs = statistics.median(iso), statistics.median(st)
        line = f"{k[0]} d{k[1]} B={k[2]} ctx={k[3]}: {bi:.1f} / {bs:.1f} (n={len(iso)})"
        for n in variants:
            if k in vs[n] and vs[n][k][0]:
                vi, vt = statistics.median(vs[n][k][0]), statistics.median(vs[n][k][1])
                line += f" | {n} {bi / vi:.3f} / {bs / vt:.3f}"
                logs[n][0].append(math.log(bi / vi))
                logs[n][1].append(math.log(bs / vt))
        print(line)
    for n, (a, s) in logs.items():
        if a:
            print(f"{n}: geometric mean {math.exp(sum(a) / len(a)):.4f} / {math.exp(sum(s) / len(s)):.4f} over {len(a)} rows")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

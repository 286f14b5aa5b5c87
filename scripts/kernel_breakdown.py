#!/usr/bin/env python3
"""Per-kernel time breakdown of fp8kv forward steps from an nsys
cuda_gpu_trace CSV (scripts/gpu_bench.sh, case nsys_*).

The trace is cut into steps at each embedding kernel (the first kernel of a
forward pass). A step with more than 8 GEMV kernels (gemv_*: one per
projection) is a decode step; the others are prefill steps. For each kind it prints the step's span (first
kernel start to last kernel end), the summed kernel busy time and the top
kernels by time; decode figures are per step (mean over the decode steps).
Kernels overlap under PDL, so busy time can exceed the span.
  kernel_breakdown.py TRACE.csv
"""
import collections
import csv
import re
import sys


def short(name):
    name = name.replace("(anonymous namespace)", "anon")
    name = re.sub(r"\(.*", "", name)  # drop the argument list
    name = re.sub(r"^void ", "", name)
    base, _, targs = name.partition("<")
    return (base.rsplit("::", 1)[-1] + ("<" + targs if targs else ""))[:60]


def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        rd = csv.DictReader(f)
        cols = rd.fieldnames or []
        c_start = next(c for c in cols if c.startswith("Start"))
        c_dur = next(c for c in cols if c.startswith("Duration"))
        c_name = next(c for c in cols if c == "Name")
        for r in rd:
            try:
                rows.append((int(float(r[c_start])), int(float(r[c_dur])), r[c_name]))
            except (ValueError, TypeError):
                continue  # memcpy / memset rows without a kernel
    rows.sort()
    steps, cur = [], None
    for start, dur, name in rows:
        if "embedding_kernel" in name:
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((start, dur, name))
    if not steps:
        print("kernel_breakdown: no embedding kernel in the trace")
        return
    kinds = {"prefill": [], "decode": []}
    for st in steps:
        # A prefill step's LM head (one row) is a GEMV too: decode steps have one per projection.
        kinds["decode" if sum("gemv" in n for _, _, n in st) > 8 else "prefill"].append(st)
    for kind, sts in kinds.items():
        if not sts:
            continue
        if kind == "decode" and len(sts) > 2:
            sts = sts[1:]  # the first decode step may include one-time work
        n = len(sts)
        span = sum(st[-1][0] + st[-1][1] - st[0][0] for st in sts) / n / 1e3
        busy = sum(d for st in sts for _, d, _ in st) / n / 1e3
        launches = sum(len(st) for st in sts) / n
        per = collections.defaultdict(lambda: [0.0, 0])
        for st in sts:
            for _, d, name in st:
                per[short(name)][0] += d / n / 1e3
                per[short(name)][1] += 1 / n
        print(f"{kind}: {n} step(s); per step: span {span:.1f} us, kernel busy {busy:.1f} us, {launches:.0f} kernels")
        for name, (us, cnt) in sorted(per.items(), key=lambda kv: -kv[1][0])[:18]:
            print(f"  {name:60} {us:9.1f} us {cnt:6.0f} calls {us / max(cnt, 1e-9):8.2f} us/call {us / busy:6.1%}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Old-vs-new rows of scripts/gpu.sh's summary table.

  ab_table.py kernels DIR      DIR/new.jsonl, old.jsonl (bench_attention lines), sdpa.jsonl
  ab_table.py engine DIR       DIR/NAME.new.I.json, NAME.old.I.json (fp8kv bench --json)
  ab_table.py hashes NEW OLD   two test_cuda logs: their `decode-hash` lines
  ab_table.py ncu DIR LAYERS   DIR/new.csv, old.csv (ncu --csv --metrics
                               gpu__time_duration.sum): per kernel, its launches
                               in steps of LAYERS (one per layer), the two
                               longest steps after the startup warm-up's, in
                               us per layer

Each sample is a fresh process, old and new interleaved (docs/design.md
"Performance method"); a row is the median of its samples. "speed n/o" is
old time / new time, or new / old tok/s: below 0.98 the row says SLOWER.
kernels and engine also write DIR/table.txt (the same rows).
"""
import collections
import csv
import glob
import json
import math
import os
import re
import statistics
import sys

SLOWER = 0.98


def row(step, case, new="", old="", speed="", note=""):
    return f"{step:8} {case:30} {new:>12} {old:>12} {speed:>9}  {note}"


def jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def kernel_samples(lines):
    """{case: [(ms, ms_stream), ...]} and the copy bandwidth samples."""
    s, copy = collections.defaultdict(list), []
    for j in lines:
        k = j.get("kind")
        if k == "copy":
            copy.append(j["GBps"])
        elif k == "decode":
            ctx = j["ctx"]
            ctx = f"{ctx // 1024}K" if ctx % 1024 == 0 else str(ctx)
            s[f"decode {j['dtype']} d{j['d']} B={j['batch']} {ctx}"].append((j["ms"], j["ms_stream"], j["frac_copy"]))
        elif k == "store":
            s[f"store {j['dtype']} {j['tokens'] // 1024}K tok"].append((j["ms"], None, None))
        elif k == "prefill":
            d = j.get("head_dim", 128)  # rows before head_dim was printed are d128
            s[f"prefill {j['dtype']} {j['seq'] // 1024}K causal" + ("" if d == 128 else f" d{d}")].append(
                (j["ms"], None, None))
    return s, copy


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def kernels(d):
    new, copy_new = kernel_samples(jsonl(f"{d}/new.jsonl"))
    old, _ = kernel_samples(jsonl(f"{d}/old.jsonl"))
    sdpa = {}
    for j in jsonl(f"{d}/sdpa.jsonl"):
        if j["kind"] == "sdpa_decode":
            sdpa[(j["d"], j["batch"], j["ctx"])] = j["ms"]
        elif j["kind"] == "sdpa_prefill":
            sdpa["prefill"] = j["ms"]
    rows, logs = [], []
    c = med(copy_new)
    if c:
        rows.append(row("kernels", "copy ceiling (D2D, read+write)", f"{c:.0f}", "", "", "GB/s"))
    for case in sorted(new, key=lambda k: (k.split()[0], k)):
        n_ms, n_st, frac = (med([x[i] for x in new[case]]) for i in range(3))
        note = [f"n={len(new[case])}"]
        if frac:
            note.append(f"{100 * frac:.0f}% of copy")
        parts = case.split()
        if parts[0] == "decode":
            dd, b = int(parts[2][1:]), int(parts[3][2:])
            ctx = int(parts[4][:-1]) * 1024 if parts[4].endswith("K") else int(parts[4])
            s = sdpa.get((dd, b, ctx))
            if s:
                note.append(f"time/SDPA bf16 {n_ms / s:.2f}")
        elif parts[0] == "prefill" and parts[-1] == "causal" and "prefill" in sdpa:  # SDPA's prefill is d128
            note.append(f"time/SDPA bf16 {n_ms / sdpa['prefill']:.2f}")
        if parts[1].endswith("_per_token_head"):  # beside the per-tensor fp8 row of the same shape
            ref = new.get(" ".join([parts[0], "fp8_e4m3"] + parts[2:]))
            if ref:
                note.append(f"time/fp8_e4m3 {n_ms / med([x[0] for x in ref]):.3f}")
        o_ms = med([x[0] for x in old.get(case, [])])
        speed = ""
        if o_ms:
            sp = o_ms / n_ms
            logs.append(math.log(sp))
            speed = f"{sp:.3f}"
            o_st = med([x[1] for x in old[case]])
            if n_st and o_st:
                note.append(f"stream speed {o_st / n_st:.3f}")
            if sp < SLOWER:
                note.append("SLOWER")
        rows.append(row("kernels", case, f"{n_ms * 1e3:.1f} us", f"{o_ms * 1e3:.1f} us" if o_ms else "", speed, ", ".join(note)))
    if logs:
        rows.append(row("kernels", f"geometric mean ({len(logs)} rows)", "", "", f"{math.exp(sum(logs) / len(logs)):.3f}"))
    if not new:
        rows.append(row("kernels", "bench_attention", note="FAIL: no result"))
    return rows


def engine(d):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in sorted(glob.glob(f"{d}/*.json")):
        name, side = os.path.basename(f).split(".")[:2]
        try:
            runs[name][side].append(json.load(open(f)))
        except (ValueError, OSError):
            pass
    rows = []
    for name in sorted(runs):
        metrics = [("ms/step", "decode_ms_per_step", False), ("TTFT ms", "ttft_ms", False)]
        if name.startswith("thr"):
            metrics = [("out tok/s", "output_tokens_per_s", True), ("TTFT ms", "ttft_ms", False)]
        for label, key, rate in metrics:
            n = med([j.get(key) for j in runs[name]["new"]])
            o = med([j.get(key) for j in runs[name]["old"]])
            if n is None:
                rows.append(row("engine", f"{name} {label}", note="FAIL: no result"))
                continue
            note = [f"n={len(runs[name]['new'])}"]
            ff = med([j.get("floor_fraction") for j in runs[name]["new"]])
            if ff and key == "decode_ms_per_step":
                note.append(f"floor fraction {ff:.3f}")
            speed = ""
            if o:
                sp = n / o if rate else o / n
                speed = f"{sp:.3f}"
                if sp < SLOWER and key != "ttft_ms":
                    note.append("SLOWER")
            rows.append(row("engine", f"{name} {label}", f"{n:.3f}" if n < 100 else f"{n:.1f}",
                            (f"{o:.3f}" if o < 100 else f"{o:.1f}") if o else "", speed, ", ".join(note)))
    if not runs:
        rows.append(row("engine", "fp8kv bench", note="FAIL: no result"))
    return rows


def hashes(new_log, old_log):
    def read(path):
        lines = []
        try:
            with open(path, errors="replace") as f:
                lines = [line.split() for line in f if line.startswith("decode-hash ")]
        except FileNotFoundError:
            pass
        return [(" ".join(x[1:-1]), x[-1]) for x in lines]
    new, old = read(new_log), read(old_log)
    old_full, old_keys = set(old), {k for k, _ in old}
    same = sum((k, h) in old_full for k, h in new)
    other = sum(k not in old_keys for k, _ in new)
    differ = len(new) - same - other
    if not new:
        note = "FAIL: no decode-hash lines in the new build's log"
    elif differ:
        note = f"FAIL: {differ} of {len(new) - other} launches differ"
    else:
        note = f"PASS: {same} of {same} launches bitwise equal"
    if other:
        note += f" ({other} launches of cases the previous build does not run)"
    return [row("test", "decode outputs vs previous", str(len(new)), str(len(old)), "", note)]


def ncu_launches(path):
    """(kernel base name, us) per launch, in launch order, from an ncu --csv file."""
    out = []
    try:
        with open(path, newline="") as f:
            hdr = None
            for r in csv.reader(f):
                if "Kernel Name" in r and "Metric Value" in r:
                    hdr = r
                    continue
                if not hdr or len(r) != len(hdr):
                    continue
                d = dict(zip(hdr, r))
                if d.get("Metric Name") != "gpu__time_duration.sum":
                    continue
                name = re.sub(r"[<(].*$", "", d["Kernel Name"]).split("::")[-1].strip()
                name = name.split()[-1] if name else d["Kernel Name"]
                out.append((name, float(d["Metric Value"].replace(",", "")) / 1000.0))
    except FileNotFoundError:
        pass
    return out


def ncu_steps(launches, layers):
    """Per kernel: the mean us of each step (consecutive groups of `layers` launches)."""
    by = collections.OrderedDict()
    for name, us in launches:
        by.setdefault(name, []).append(us)
    return {n: [sum(xs[i:i + layers]) / len(xs[i:i + layers]) for i in range(0, len(xs), layers)]
            for n, xs in by.items()}


def ncu(d, layers):
    new = ncu_steps(ncu_launches(os.path.join(d, "new.csv")), layers)
    old = ncu_steps(ncu_launches(os.path.join(d, "old.csv")), layers)
    rows = []
    for name, steps in new.items():
        # The two longest steps after the first (the engine's warm-up
        # prefill at startup): a prompt's prefill steps, in launch order.
        top = sorted(sorted(range(1, len(steps)), key=lambda i: -steps[i])[:2])
        for k, i in enumerate(top):
            o = old.get(name, [])
            ov = o[i] if i < len(o) and len(o) == len(steps) else None
            speed = f"{ov / steps[i]:.3f}" if ov else ""
            note = f"us per layer, step {i + 1} of {len(steps)}" + (" SLOWER" if ov and ov / steps[i] < SLOWER else "")
            rows.append(row("gdnprof", f"{name[:24]} #{k + 1}", f"{steps[i]:.1f}", f"{ov:.1f}" if ov else "", speed,
                            note))
    return rows


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what in ("kernels", "engine") and len(sys.argv) == 3:
        rows = kernels(sys.argv[2]) if what == "kernels" else engine(sys.argv[2])
        with open(os.path.join(sys.argv[2], "table.txt"), "w") as f:
            f.write(row("step", "case", "new", "old", "speed n/o", "note") + "\n" + "\n".join(rows) + "\n")
    elif what == "hashes" and len(sys.argv) == 4:
        rows = hashes(sys.argv[2], sys.argv[3])
    elif what == "ncu" and len(sys.argv) == 4:
        rows = ncu(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
    print("\n".join(rows))


if __name__ == "__main__":
    main()

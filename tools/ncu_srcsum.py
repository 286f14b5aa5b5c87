#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute.

  ncu --section SourceCounters --section WarpStateStats -o prof ...
  ncu -i prof.ncu-rep --page source --csv --print-source sass > src.csv
  python3 tools/ncu_srcsum.py src.csv

Prints the warp stall samples by opcode and by reason (the `stall_*`
columns), then every instruction holding >= 0.3% of the samples, in address
order, with its execution count and its three largest reasons. Used by
scripts/gpu_decode.sh (SRCJOBS; docs/cuda.md "Decode v15").
"""
import collections
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main(path):
    rows = list(csv.reader(open(path, errors="replace")))
    hi = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if hi is None:
        print("no 'Source' header; first lines:")
        for r in rows[:10]:
            print(",".join(r)[:200])
        return
    h = [c.strip() for c in rows[hi]]
    data = [r for r in rows[hi + 1:] if len(r) == len(h)]
    src = h.index("Source")
    samp = next((i for i, c in enumerate(h) if c.startswith("Warp Stall Sampling (All")), None)
    ie = next((i for i, c in enumerate(h) if c == "Instructions Executed"), None)
    if samp is None:
        print("no warp stall samples in", path)
        return
    # Reasons: the stall_* columns counted over all samples (not the "(Not Issued)" subset).
    reasons = [i for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    tot = sum(num(r[samp]) for r in data) or 1.0
    executed = sum(num(r[ie]) for r in data) if ie is not None else -1
    print(f"instructions {len(data)}, samples {tot:.0f}, instructions executed {executed:.0f}")
    byop, byreason = collections.Counter(), collections.Counter()
    for r in data:
        words = [w for w in r[src].split() if not w.startswith("@")]
        byop[words[0].split(".")[0] if words else "?"] += num(r[samp])
        for i in reasons:
            byreason[h[i]] += num(r[i])
    print("samples by opcode:", ", ".join(f"{k} {v / tot * 100:.1f}%" for k, v in byop.most_common(12)))
    print("samples by reason:", ", ".join(f"{k} {v / tot * 100:.1f}%" for k, v in byreason.most_common(8)))
    print("-- instructions with >= 0.3% of the samples: index | share | executed | SASS | top reasons")
    for idx, r in enumerate(data):
        s = num(r[samp])
        if s / tot < 0.003:
            continue
        top = sorted(((num(r[i]), h[i]) for i in reasons), reverse=True)[:3]
        top = " ".join(f"{n}={v:.0f}" for v, n in top if v > 0)
        ex = num(r[ie]) if ie is not None else 0
        print(f"{idx:5d} {s / tot * 100:5.1f}% {ex:10.0f}  {r[src][:70]:70s} {top}")


if __name__ == "__main__":
    main(sys.argv[1])

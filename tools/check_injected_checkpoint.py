#!/usr/bin/env python3
"""GPU-machine check: an fp8kv-injected checkpoint loads in transformers and
safetensors, its weights are bit-identical to the original, and the scales
read through the index equal the calibration report.

Self-contained (needs torch, transformers, safetensors and a built fp8kv):

  python3 tools/check_injected_checkpoint.py --fp8kv build/fp8kv [--work /tmp/fp8kv_inject_check]

builds a tiny random Llama with transformers (save_pretrained: a single
model.safetensors, and a sharded copy), runs `fp8kv calibrate` on it (token
ids corpus) and `fp8kv inject` (--output, both namings, and --in-place), then
checks each result. Or check an existing pair:

  python3 tools/check_injected_checkpoint.py --original DIR --injected DIR --report REPORT.json

Prints one line per check and a summary table; exit 1 on any failure.
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok), detail))
    print(f"[{'ok' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def index_tensors(d):
    """name -> file, the way vLLM/fp8kv read a checkpoint (index authoritative)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return json.load(f)["weight_map"]
    out = {}
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        for k in f.keys():
            out[k] = "model.safetensors"
    return out


def read_all(d):
    wm = index_tensors(d)
    by_file = {}
    for k, v in wm.items():
        by_file.setdefault(v, []).append(k)
    out = {}
    for fn, names in by_file.items():
        with safe_open(os.path.join(d, fn), "pt") as f:
            keys = set(f.keys())
            for n in names:
                if n not in keys:
                    raise RuntimeError(f"{fn}: index lists {n} but the file lacks it")
                out[n] = f.get_tensor(n)
    return out


def check_pair(original, injected, report_path, label):
    with open(report_path) as f:
        rep = json.load(f)
    check(f"{label}: report complete", rep["status"] == "complete", rep.get("reason", ""))
    orig = read_all(original)
    new = read_all(injected)
    scale_names = [n for n in new if n.endswith("_scale")]
    check(f"{label}: safetensors reads every indexed tensor", len(new) >= len(orig), f"{len(new)} tensors")
    same = all(torch.equal(orig[n], new[n]) for n in orig if not n.endswith("_scale"))
    check(f"{label}: weights bit-identical to the original", same)
    # Scales == report (float32 bits).
    bad = []
    for e in rep["layers"]:
        l = e["layer"]
        for s in ("k", "v", "q"):
            cands = [n for n in scale_names if f"layers.{l}.self_attn." in n and n.endswith(f".{s}_scale")]
            if not cands:
                if s != "q":
                    bad.append(f"layer {l} {s}: missing")
                continue
            t = new[cands[0]]
            if t.dtype != torch.float32:
                bad.append(f"{cands[0]} dtype {t.dtype}")
            want = e[f"{s}_scale"]
            want = [f32(x) for x in want] if isinstance(want, list) else [f32(want)]
            got = t.flatten().tolist()
            if got != want:
                bad.append(f"{cands[0]}: {got} != {want}")
    check(f"{label}: scales equal the report (float32 bits)", not bad, "; ".join(bad[:4]))
    # transformers: loads, and logits equal the original's (scales are not used by HF attention).
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (1, 24))
    m0 = AutoModelForCausalLM.from_pretrained(original, torch_dtype=torch.float32)
    try:
        m1 = AutoModelForCausalLM.from_pretrained(injected, torch_dtype=torch.float32)
        ok = True
    except Exception as ex:  # noqa: BLE001
        ok = False
        check(f"{label}: transformers from_pretrained", False, repr(ex)[:300])
    if ok:
        check(f"{label}: transformers from_pretrained", True)
        with torch.no_grad():
            d = (m0(ids).logits - m1(ids).logits).abs().max().item()
        check(f"{label}: transformers logits identical to the original", d == 0.0, f"max |diff| {d}")
    # SHA256SUMS present and correct.
    sums = os.path.join(injected, "SHA256SUMS")
    if check(f"{label}: SHA256SUMS present", os.path.exists(sums)):
        r = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=injected, capture_output=True, text=True)
        check(f"{label}: sha256sum -c SHA256SUMS", r.returncode == 0, r.stdout[-300:] + r.stderr[-300:])


def run(cmd):
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr, sep="\n")
    return r


def self_contained(fp8kv, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(1)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # plant a V outlier in layer 1 so its v_scale leaves 1.0
        model.model.layers[1].self_attn.v_proj.weight[5].mul_(2000.0)
    single = os.path.join(work, "single")
    sharded = os.path.join(work, "sharded")
    model.save_pretrained(single, safe_serialization=True)
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    check("transformers wrote a sharded copy", os.path.exists(os.path.join(sharded, "model.safetensors.index.json")))
    rng = random.Random(3)
    ids = os.path.join(work, "ids.json")
    with open(ids, "w") as f:
        json.dump([[rng.randrange(128) for _ in range(64)] for _ in range(4)], f)
    report = os.path.join(work, "report.json")
    r = run([fp8kv, "calibrate", single, "--corpus-ids-file", ids, "--output", report])
    check("fp8kv calibrate", r.returncode == 0, r.stderr[-400:])
    if r.returncode != 0:
        return
    with open(report) as f:
        rep = json.load(f)
    check("calibrate found the planted outlier layer", rep["layers"][1]["v_scale"] > 1.0,
          f"v_amax {rep['layers'][1]['v_amax']}, v_scale {rep['layers'][1]['v_scale']}")
    for src, label in ((single, "single"), (sharded, "sharded")):
        for naming in ("hf", "vllm-runtime"):
            out = os.path.join(work, f"{label}-{naming}")
            r = run([fp8kv, "inject", src, "--report", report, "--output", out, "--naming", naming])
            if check(f"fp8kv inject {label} --naming {naming}", r.returncode == 0, r.stderr[-400:]):
                check_pair(src, out, report, f"{label}/{naming}")
    inplace = os.path.join(work, "inplace")
    shutil.copytree(sharded, inplace)
    r = run([fp8kv, "inject", inplace, "--report", report, "--in-place"])
    if check("fp8kv inject --in-place", r.returncode == 0, r.stderr[-400:]):
        check_pair(sharded, inplace, report, "in-place")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp8kv")
    ap.add_argument("--work", default="/tmp/fp8kv_inject_check")
    ap.add_argument("--original")
    ap.add_argument("--injected")
    ap.add_argument("--report")
    a = ap.parse_args()
    if a.original and a.injected and a.report:
        check_pair(a.original, a.injected, a.report, "given")
    elif a.fp8kv:
        self_contained(a.fp8kv, a.work)
    else:
        ap.error("give --fp8kv BIN, or --original/--injected/--report")
    failed = [r for r in RESULTS if not r[1]]
    print(f"\n{'check':<60} result")
    for name, ok, _ in RESULTS:
        print(f"{name:<60} {'ok' if ok else 'FAIL'}")
    print(f"\n{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

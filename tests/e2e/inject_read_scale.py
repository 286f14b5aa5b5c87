#!/usr/bin/env python3
"""Prints the float32 value of one tensor of a checkpoint, read the way
Hugging Face loaders do (index when present, else model.safetensors), with the
standard library only: inject_read_scale.py DIR TENSOR. Prints "missing" when
the tensor is not listed."""
import json
import os
import struct
import sys

d, name = sys.argv[1], sys.argv[2]
idx = os.path.join(d, "model.safetensors.index.json")
if os.path.exists(idx):
    with open(idx) as f:
        wm = json.load(f)["weight_map"]
    if name not in wm:
        print("missing")
        sys.exit(0)
    path = os.path.join(d, wm[name])
else:
    path = os.path.join(d, "model.safetensors")
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    if name not in header:
        print("missing")
        sys.exit(0)
    e = header[name]
    assert e["dtype"] == "F32", e
    f.seek(8 + n + e["data_offsets"][0])
    count = (e["data_offsets"][1] - e["data_offsets"][0]) // 4
    vals = struct.unpack(f"<{count}f", f.read(4 * count))
    print(" ".join(repr(v) for v in vals))

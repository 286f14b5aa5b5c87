#!/usr/bin/env python3
"""safetensors interop between fp8kv's C++ reader/writer and the Python library.

Run from the repository root (needs torch and safetensors):

    python3 tools/check_safetensors_interop.py [--read-dir DIR ...] [--out tests/golden/safetensors_py]

1. READ: every *.safetensors under the read dirs (default: tests/data/safetensors_cpp
   and tests/data/tiny_llama, all written by fp8kv's writer) is opened with
   safetensors.safe_open(framework="pt"). Each tensor's raw bytes must equal
   the bytes at its data_offsets (parsed independently with struct/json), and
   where DIR/<stem>.expected.json states values, dtype/shape/values must
   match exactly (float8 included).
2. WRITE: writes tiny files with the Python library into --out, for the C++
   test tests/io/test_safetensors_interop.cpp to read back:
     py_dtypes.safetensors   save_file() with F32, F16, BF16, F64, F8_E4M3,
                             F8_E5M2, I64, I32, I16, U8, I8, BOOL, a scalar and
                             an empty tensor, plus __metadata__
     py_misaligned.safetensors   hand-built (the library never writes this,
                             but the format allows it): a 1-byte U8 first, so
                             the F32 and BF16 tensors sit at odd offsets; it is
                             checked to load in Python before being kept
     expected.json           per file and tensor: dtype, shape, raw bytes (hex)
                             and float values (non-finite as "nan"/"inf"/"-inf")
Prints one line per check and a final verdict; exit status 0 only when all pass.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool,
}
FLOATS = {"F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2"}

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def json_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def parse_header(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def read_ours(dirs):
    for d in dirs:
        if not os.path.isdir(d):
            check(False, f"read dir {d} exists")
            continue
        for fn in sorted(os.listdir(d)):
            if not fn.endswith(".safetensors"):
                continue
            path = os.path.join(d, fn)
            header, data = parse_header(path)
            exp_path = os.path.join(d, fn[: -len(".safetensors")] + ".expected.json")
            expected = json.load(open(exp_path)) if os.path.exists(exp_path) else {}
            with safe_open(path, framework="pt") as f:
                names = set(f.keys())
                check(names == {k for k in header if k != "__metadata__"}, f"{path}: tensor names")
                check((f.metadata() or {}) == header.get("__metadata__", {}), f"{path}: metadata")
                for name in sorted(names):
                    t = f.get_tensor(name)
                    h = header[name]
                    b0, b1 = h["data_offsets"]
                    ok = t.dtype == DTYPES[h["dtype"]] and list(t.shape) == h["shape"] and raw_bytes(t) == data[b0:b1]
                    check(ok, f"{path}: {name} bytes/dtype/shape as the header says")
                    if name in expected:
                        e = expected[name]
                        vals = t.float().reshape(-1).tolist() if e["dtype"] in FLOATS and e["dtype"] != "F64" else \
                            t.reshape(-1).tolist()
                        check(e["dtype"] == h["dtype"] and e["shape"] == list(t.shape) and vals == e["values"],
                              f"{path}: {name} values {vals[:6]} == expected {e['values'][:6]}")


def expected_entry(t: torch.Tensor, dtype: str):
    vals = t.double().reshape(-1).tolist() if dtype in FLOATS else t.reshape(-1).tolist()
    if dtype in FLOATS:
        vals = [json_float(v) for v in vals]
    return {"dtype": dtype, "shape": list(t.shape), "hex": raw_bytes(t).hex(), "values": vals}


def write_golden(out):
    os.makedirs(out, exist_ok=True)
    expected = {}
    f8 = torch.tensor([1.0, 448.0, -448.0, 2.0 ** -9, 0.0, -0.0, 3.5, 0.1])
    tensors = {
        "f32": torch.tensor([[1.5, -2.0, 3.0e38], [1e-40, float("inf"), float("nan")]], dtype=torch.float32),
        "f16": torch.tensor([1.0, -2.0, 65504.0, 2.0 ** -24, 1.0 / 3.0], dtype=torch.float16),
        "bf16": torch.tensor([1.0, -5.0, 3.140625, 1e-3, -3.0e38], dtype=torch.bfloat16),
        "f64": torch.tensor([0.1, -1e300], dtype=torch.float64),
        "f8_e4m3": f8.to(torch.float8_e4m3fn),  # all in range: a plain cast is exact RNE here
        "f8_e5m2": torch.tensor([1.0, 57344.0, 2.0 ** -16, -1.5, 0.1]).to(torch.float8_e5m2),
        "i64": torch.tensor([-5, 2 ** 62 + 1], dtype=torch.int64),
        "i32": torch.tensor([[7, -8, 9]], dtype=torch.int32),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "u8": torch.tensor([0, 255, 7], dtype=torch.uint8),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(0.25, dtype=torch.float32),
        "empty": torch.zeros((0, 3), dtype=torch.bfloat16),
    }
    path = os.path.join(out, "py_dtypes.safetensors")
    save_file(tensors, path, metadata={"format": "pt", "writer": "python safetensors"})
    header, _ = parse_header(path)
    expected["py_dtypes.safetensors"] = {
        "metadata": header.get("__metadata__", {}),
        "tensors": {k: expected_entry(v, header[k]["dtype"]) for k, v in tensors.items()},
    }
    check(True, f"wrote {path}")

    # Misaligned: U8[1] at offset 0, then F32[3] at 1, BF16[2] at 13, F64[1] at 17.
    parts = [("a_u8", "U8", torch.tensor([42], dtype=torch.uint8)),
             ("b_f32", "F32", torch.tensor([3.5, -1.25, 1e-3], dtype=torch.float32)),
             ("c_bf16", "BF16", torch.tensor([2.0, -0.5], dtype=torch.bfloat16)),
             ("d_f64", "F64", torch.tensor([1.0 / 3.0], dtype=torch.float64))]
    hdr, data = {}, b""
    for name, dt, t in parts:
        b = raw_bytes(t)
        hdr[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    hb = json.dumps(hdr, separators=(",", ":")).encode()
    hb += b" " * (-(8 + len(hb)) % 8)
    path = os.path.join(out, "py_misaligned.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + data)
    try:
        with safe_open(path, framework="pt") as f:
            loaded = all(torch.equal(f.get_tensor(n), t) for n, _, t in parts)
        check(loaded, f"{path}: Python safetensors loads the misaligned file with the same values")
    except Exception as e:  # keep the file: the format allows it, our reader must too
        print(f"note {path}: Python safetensors refuses it: {e}")
    expected["py_misaligned.safetensors"] = {
        "metadata": {}, "tensors": {n: expected_entry(t, dt) for n, dt, t in parts}}

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"generator": "tools/check_safetensors_interop.py", "torch": torch.__version__,
                   "safetensors": __import__("safetensors").__version__, "files": expected}, f, indent=1)
        f.write("\n")
    check(True, f"wrote {os.path.join(out, 'expected.json')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--read-dir", action="append",
                    help="dirs of fp8kv-written .safetensors (default: tests/data/safetensors_cpp, tests/data/tiny_llama)")
    ap.add_argument("--out", default="tests/golden/safetensors_py")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    read_ours(args.read_dir or ["tests/data/safetensors_cpp", "tests/data/tiny_llama"])
    if not args.no_write:
        write_golden(args.out)
    print(f"VERDICT: {'PASS' if not failures else 'FAIL'} ({len(failures)} failure(s))")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Edits a safetensors file for the bad-input e2e tests (stdlib only).
  st_edit.py FILE set-f32 TENSOR INDEX VALUE   overwrite one F32 element (VALUE: nan, inf, -inf or a float)
  st_edit.py FILE add-f32 TENSOR VALUE         add a scalar F32 tensor (file rewritten)
  st_edit.py FILE only-f32 TENSOR VALUE        replace the file by one holding only that scalar
"""
import json
import struct
import sys


def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def write(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


def main():
    path, cmd = sys.argv[1], sys.argv[2]
    if cmd == "set-f32":
        name, index, value = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        header, _ = read(path)
        t = header[name]
        assert t["dtype"] == "F32", t
        n = struct.unpack("<Q", open(path, "rb").read(8))[0]
        with open(path, "r+b") as f:
            f.seek(8 + n + t["data_offsets"][0] + 4 * index)
            f.write(struct.pack("<f", value))
    elif cmd in ("add-f32", "only-f32"):
        name, value = sys.argv[3], float(sys.argv[4])
        header, data = read(path) if cmd == "add-f32" else ({}, b"")
        header[name] = {"dtype": "F32", "shape": [], "data_offsets": [len(data), len(data) + 4]}
        write(path, header, data + struct.pack("<f", value))
    else:
        sys.exit("unknown command " + cmd)


main()

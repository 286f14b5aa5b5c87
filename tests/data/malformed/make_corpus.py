#!/usr/bin/env python3
"""Writes the malformed safetensors corpus (plain python3, no dependencies).

Every *.safetensors file here must be rejected with fp8kv::InputError
(tests/io/test_malformed_corpus.cpp replays them; the fuzzer is seeded with
them). Run from anywhere: python3 tests/data/malformed/make_corpus.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def raw(header_bytes: bytes, data: bytes = b"", header_len=None) -> bytes:
    n = len(header_bytes) if header_len is None else header_len
    return struct.pack("<Q", n) + header_bytes + data


def st(header: dict, data: bytes) -> bytes:
    return raw(json.dumps(header).encode(), data)


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


F32x2 = b"\x00\x00\x80\x3f\x00\x00\x00\x40"  # [1.0, 2.0]

CASES = {
    "empty": b"",
    "short_5_bytes": b"\x05\x00\x00\x00\x00",
    "header_len_beyond_file": raw(b'{"a":1}', header_len=1000),
    "header_len_over_100mib": raw(b"{}", header_len=100 * 1024 * 1024 + 1),
    "header_len_u64_max": raw(b"{}", header_len=2**64 - 1),
    "invalid_json": raw(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'),
    "not_an_object": raw(b"[1, 2, 3]"),
    "invalid_utf8_name": raw(b'{"\xff\xfe": {"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', F32x2),
    "unknown_dtype": st({"a": t("F12", [2], 0, 8)}, F32x2),
    "missing_dtype": st({"a": {"shape": [2], "data_offsets": [0, 8]}}, F32x2),
    "shape_size_mismatch": st({"a": t("F32", [3], 0, 8)}, F32x2),
    "offsets_out_of_range": st({"a": t("F32", [4], 0, 16)}, F32x2),
    "offsets_overflow": st({"a": t("F32", [2], 2**64 - 9, 2**64 - 1)}, F32x2),
    "offsets_too_big_for_u64": raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551624]}}', F32x2),
    "offsets_begin_after_end": st({"a": t("F32", [2], 8, 0)}, F32x2),
    "offsets_wrong_arity": st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, F32x2),
    "overlapping_spans": st({"a": t("F32", [2], 0, 8), "b": t("F32", [1], 4, 8)}, F32x2),
    "hole_between_tensors": st({"a": t("F32", [1], 0, 4), "b": t("U8", [2], 6, 8)}, F32x2),
    "hole_at_start": st({"a": t("F32", [1], 4, 8)}, F32x2),
    "trailing_bytes": st({"a": t("F32", [1], 0, 4)}, F32x2),
    "duplicate_name": raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                          b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', F32x2),
    "negative_dim": st({"a": t("F32", [-2], 0, 8)}, F32x2),
    "float_dim": st({"a": t("F32", [2.0], 0, 8)}, F32x2),
    "string_dim": st({"a": t("F32", ["2"], 0, 8)}, F32x2),
    "shape_product_overflow": st({"a": t("F32", [2**62, 2**62, 4], 0, 8)}, F32x2),
    "metadata_not_string": st({"__metadata__": {"format": 1}, "a": t("F32", [2], 0, 8)}, F32x2),
    "entry_not_object": st({"a": [1, 2]}, F32x2),
}


def main():
    for name, data in CASES.items():
        with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
            f.write(data)
    print(f"wrote {len(CASES)} files to {HERE}")


if __name__ == "__main__":
    main()

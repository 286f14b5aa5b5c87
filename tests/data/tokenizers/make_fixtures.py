#!/usr/bin/env python3
"""Writes the small hand-made tokenizer.json fixtures used by tests/tokenizer
and tests/e2e/tokenize.sh. Plain Python (no `tokenizers` needed). The expected
ids in the tests are derived by hand from the merges listed here.

Run from the repo root: python3 tests/data/tokenizers/make_fixtures.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools"))
from byte_level import bytes_to_unicode  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)))


def added(id_, content, special, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def write(name, obj):
    path = os.path.join(OUT, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


# ---- byte-level (GPT-2 style): token id of byte b is b --------------------
b2u = bytes_to_unicode()
bl_vocab = {b2u[b]: b for b in range(256)}
bl_merges = ["l l", "h e", "e l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ Ġ"]
for m in bl_merges:
    a, b = m.split(" ")
    bl_vocab[a + b] = len(bl_vocab)  # ll=256 he=257 el=258 hell=259 hello=260 Ġw=261 or=262 Ġwor=263 ld=264 Ġworld=265 ĠĠ=266
bytelevel = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [
        added(267, "<|endoftext|>", True),
        added(268, "[L]", False, normalized=False, lstrip=True),
        added(269, "[R]", False, normalized=False, rstrip=True),
        added(270, "cat", False, normalized=True, single_word=True),
    ],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": bl_vocab, "merges": bl_merges},
}
write("bytelevel.json", bytelevel)

# ---- Llama-3 style: Split(llama3 regex) + ByteLevel(use_regex=False), bos ----
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
llama3 = json.loads(json.dumps(bytelevel))
llama3["added_tokens"] = [added(268, "<|end_of_text|>", True), added(269, "<|begin_of_text|>", True)]
llama3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
llama3["post_processor"] = {"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
              {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
     "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [269], "tokens": ["<|begin_of_text|>"]}}}]}
llama3["model"]["ignore_merges"] = True
llama3["model"]["vocab"]["ow"] = 267  # reachable only through ignore_merges (no "o w" merge)
llama3["model"]["merges"] = [m.split(" ") for m in bl_merges]  # list form
write("llama3.json", llama3)

# ---- SentencePiece-style BPE (Llama-2 / Mistral) ----------------------------
sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    sp_vocab["<0x%02X>" % b] = 3 + b
for t in ["▁", "h", "e", "l", "o", "w", "r", "d"]:
    sp_vocab[t] = len(sp_vocab)  # ▁=259 h=260 e=261 l=262 o=263 w=264 r=265 d=266
sp_merges = [["l", "l"], ["▁", "h"], ["▁h", "e"], ["▁he", "ll"], ["▁hell", "o"], ["▁", "w"], ["o", "r"],
             ["▁w", "or"], ["▁wor", "l"], ["▁worl", "d"]]
for a, b in sp_merges:
    sp_vocab[a + b] = len(sp_vocab)  # ll=267 ▁h=268 ▁he=269 ▁hell=270 ▁hello=271 ▁w=272 or=273 ▁wor=274 ▁worl=275 ▁world=276
bos_template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
sp_added = [added(0, "<unk>", True), added(1, "<s>", True), added(2, "</s>", True)]
spm = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": sp_added,
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": None,
    "post_processor": bos_template,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
              "vocab": sp_vocab, "merges": sp_merges},
}
write("spm_llama2.json", spm)

# ---- Gemma style: Replace " " -> "▁" only, no byte fallback, unk fused ------
gemma = json.loads(json.dumps(spm))
gemma["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
gemma["decoder"] = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
gemma["model"]["byte_fallback"] = False
write("spm_gemma.json", gemma)

# ---- Metaspace pre-tokenizer, prepend_scheme "first" --------------------------
meta = json.loads(json.dumps(spm))
meta["normalizer"] = None
meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
meta["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
write("metaspace_first.json", meta)

# ---- model directory: no post-processor in tokenizer.json; the config's add_bos/add_eos are
# ignored by transformers 5 when tokenizer.json is present
d = json.loads(json.dumps(spm))
d["post_processor"] = None
write("llama2_dir/tokenizer.json", d)
write("llama2_dir/tokenizer_config.json", {"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>",
                                           "eos_token": "</s>", "clean_up_tokenization_spaces": False,
                                           "tokenizer_class": "PreTrainedTokenizerFast"})
# Directory without add_*_token flags: tokenizer.json's post-processor is kept.
write("keep_post_dir/tokenizer.json", spm)
write("keep_post_dir/tokenizer_config.json", {"bos_token": "<s>", "eos_token": "</s>",
                                              "tokenizer_class": "PreTrainedTokenizerFast"})
print("fixtures written to", OUT)

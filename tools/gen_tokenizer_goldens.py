#!/usr/bin/env python3
"""Golden references for fp8kv's tokenizer (tests/tokenizer/test_tokenizer_goldens.cpp).

Runs on the GPU machine (python3 with `tokenizers` and `transformers`; no
network). From the repo root:

    python3 tools/gen_tokenizer_goldens.py

It trains small BPE models with the `tokenizers` library on local text (text
generated here, the repo's .md/.txt files, Python's own stdlib sources), builds
tokenizers of each family (GPT-2, Llama-3, Qwen2, Llama-2/Mistral
SentencePiece-style, Gemma-style, ...), saves each tokenizer.json (and model
directories with tokenizer_config.json) under tests/golden/tokenizer/, and
records encode / decode results for a varied set of strings:

  bare tokenizer.json: tokenizers.Tokenizer encode(add_special_tokens=True/False)
                       and decode(skip_special_tokens=False/True)
  model directory:     transformers.AutoTokenizer encode / decode

Output: tests/golden/tokenizer/manifest.json plus one <name>.cases.json.gz per
tokenizer (gzip, tools/golden_io.py). Deterministic: fixed seeds, sorted file lists, fixed corpus caps.
"""
import glob
import json
import os
import random
import sys
import sysconfig
import unicodedata

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from golden_io import run_cases, write_gz

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "golden", "tokenizer")
CORPUS_CAP = 3_000_000  # characters of training text

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")


# ---------------------------------------------------------------- corpus ----
def generated_text(rng):
    words = ("the of and to in is was for on that with as by at from it an be this which or are have had not but "
             "all were when we there can more if will one about up out them so what time been has only other new "
             "some could these two may first then do any like my now over such our man me even most made after also "
             "did many before must through back years where much your way well down should because each just those "
             "people how too little state good very make world still own see men work long get here between both "
             "tokenizer cache scale layer quantization calibration attention kernel memory bandwidth").split()
    out = []
    for _ in range(6000):
        n = rng.randint(4, 18)
        s = " ".join(rng.choice(words) for _ in range(n))
        s = s[0].upper() + s[1:]
        if rng.random() < 0.2:
            s += " " + str(rng.randint(0, 99999))
        out.append(s + rng.choice([".", ".", ".", "?", "!", ",", ";"]))
    multilingual = ["Café naïve résumé façade coöperate. Straße Grüße Ärger Öl.",
                    "Привет, как дела? Всё хорошо, спасибо.", "Καλημέρα κόσμε, τι κάνεις;",
                    "你好，世界！今天天气很好。我们去公园吧。", "こんにちは世界。カタカナとひらがな。",
                    "안녕하세요 세계. 반갑습니다.", "مرحبا بالعالم", "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก",
                    "def f(x):\n    return x * 2\n\nfor i in range(10):\n    print(i)\n", "😀 😃 👍 🎉 ❤️"]
    for _ in range(300):
        out.append(rng.choice(multilingual))
    return "\n".join(out)


def corpus_texts():
    rng = random.Random(1234)
    texts = [generated_text(rng)]
    total = len(texts[0])
    files = sorted(glob.glob(os.path.join(ROOT, "**", "*.md"), recursive=True) +
                   glob.glob(os.path.join(ROOT, "**", "*.txt"), recursive=True))
    stdlib = sysconfig.get_paths().get("stdlib") or os.path.join(sys.prefix, "lib")
    files += sorted(glob.glob(os.path.join(stdlib, "*.py")))
    files += sorted(glob.glob(os.path.join(stdlib, "email", "*.py")) + glob.glob(os.path.join(stdlib, "json", "*.py")))
    for f in files:
        if "/build" in f or "/.git/" in f or "/tests/golden/" in f:
            continue
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(t)
        total += len(t)
        if total > CORPUS_CAP:
            break
    lines = []
    for t in texts:
        lines.extend(t.splitlines(keepends=True))
    return lines, total


# ---------------------------------------------------------------- models ----
def train_bytelevel(lines, vocab_size=1200):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tr = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False, special_tokens=[])
    tok.train_from_iterator(lines, trainer=tr)
    m = json.loads(tok.to_str())["model"]
    return m["vocab"], [tuple(x) if isinstance(x, list) else tuple(x.split(" ")) for x in m["merges"]]


def train_sentencepiece_like(lines, vocab_size=900):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=vocab_size, limit_alphabet=120, show_progress=False, special_tokens=[])
    tok.train_from_iterator(lines, trainer=tr)
    m = json.loads(tok.to_str())["model"]
    trained = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for t, _ in trained:
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(x) if isinstance(x, list) else tuple(x.split(" ")) for x in m["merges"]]
    return vocab, merges


def bytelevel_model(vocab, merges, **kw):
    return models.BPE(vocab=dict(vocab), merges=list(merges), **kw)


def build_all(bl_vocab, bl_merges, sp_vocab, sp_merges):
    """name -> (Tokenizer, merges_as_strings, dir_config or None)"""
    out = {}
    V = len(bl_vocab)

    # GPT-2 style: ByteLevel pre-tokenizer with its own regex, merges saved as "a b".
    t = Tokenizer(bytelevel_model(bl_vocab, bl_merges))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    t.add_tokens([AddedToken("[LSTRIP]", lstrip=True, normalized=False),
                  AddedToken("[RSTRIP]", rstrip=True, normalized=False),
                  AddedToken("cat", single_word=True, normalized=True),
                  AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False, special=True)])
    out["gpt2"] = (t, True, None)

    # GPT-2 with add_prefix_space=True and no post-processor (directory form too).
    t = Tokenizer(bytelevel_model(bl_vocab, bl_merges))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    out["gpt2_prefix_space"] = (t, False, None)
    out["gpt2_prefix_space_dir"] = (t, False, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})

    # Llama-3 style: Split(llama3 regex) + ByteLevel(use_regex=False), ignore_merges, bos template.
    t = Tokenizer(bytelevel_model(bl_vocab, bl_merges, ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    out["llama3"] = (t, False, None)
    out["llama3_dir"] = (t, False, {"add_bos_token": True, "add_eos_token": False, "bos_token": "<|begin_of_text|>",
                                    "eos_token": "<|end_of_text|>"})
    out["llama3_dir_eos"] = (t, False, {"add_bos_token": True, "add_eos_token": True,
                                        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})

    # Qwen2 style: NFC, Split(qwen2 regex) + ByteLevel, ByteLevel post-processor, normalized added token.
    t = Tokenizer(bytelevel_model(bl_vocab, bl_merges))
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.add_special_tokens([AddedToken(s, special=True, normalized=False)
                          for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    t.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False),
                  AddedToken("caf\u00e9", normalized=True)])
    out["qwen2"] = (t, False, None)
    out["qwen2_dir"] = (t, False, {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})

    # Llama-2 / Mistral (legacy) style: Prepend + Replace normalizer, no pre-tokenizer, byte_fallback.
    def spm_model():
        return models.BPE(vocab=dict(sp_vocab), merges=list(sp_merges), unk_token="<unk>", fuse_unk=True,
                          byte_fallback=True)
    sp_special = [AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]]
    t = Tokenizer(spm_model())
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(content=" ", left=1, right=0)])
    t.add_special_tokens(sp_special)
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                     special_tokens=[("<s>", 1)])
    t.add_tokens([AddedToken("hello world", normalized=True), AddedToken("[INST]", normalized=False, special=False,
                                                                         lstrip=True, rstrip=True)])
    out["llama2"] = (t, False, None)
    out["llama2_dir"] = (t, False, {"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>",
                                    "eos_token": "</s>", "unk_token": "<unk>"})

    # Mistral / newer Llama conversion: Metaspace(prepend_scheme="first", split=False) + Metaspace decoder.
    t = Tokenizer(spm_model())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.add_special_tokens(sp_special + [AddedToken("[INST]", special=True, normalized=False),
                                       AddedToken("[/INST]", special=True, normalized=False)])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                     special_tokens=[("<s>", 1)])
    out["mistral_metaspace"] = (t, False, None)

    # Gemma style: Replace " " -> "▁" only (no prefix), byte_fallback, decoders Replace/ByteFallback/Fuse.
    t = Tokenizer(spm_model())
    t.normalizer = normalizers.Replace(" ", "\u2581")
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    t.add_special_tokens(sp_special + [AddedToken("<start_of_turn>", special=True, normalized=False),
                                       AddedToken("<end_of_turn>", special=True, normalized=False)])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                     special_tokens=[("<s>", 1)])
    out["gemma"] = (t, False, None)

    # Misc: NFKC + Lowercase, Digits + Punctuation + ByteLevel, single_word special, no post-processor.
    t = Tokenizer(bytelevel_model(bl_vocab, bl_merges))
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.Punctuation(behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken("<SEP>", special=True, normalized=False, single_word=True)])
    t.add_tokens([AddedToken("Hello", normalized=True)])  # normalized: matches "hello" after Lowercase
    out["nfkc_misc"] = (t, False, None)
    return out


# ----------------------------------------------------------------- texts ----
def base_texts():
    t = ["", " ", "  ", "\n", "\n\n\n", "\t", "\t\t x", "Hello world", "Hello, world!", "hello   world  ",
         "  leading spaces", "trailing spaces   ", "I'm you're they've it's we'll he'd I'M YOU'RE THEY'VE",
         "don't DON'T o'clock rock'n'roll", "1 12 123 1234 12345 123456 3.14159 1,000,000 2024-01-01 0x1F",
         "def f(x):\n    return x * 2\n\n\nfor i in range(10):\n\tprint(i)  # comment\n",
         '{"key": [1, 2, 3], "nested": {"a": null}}', "https://example.com/path?q=1&r=2#frag user@example.org",
         "caf\u00e9 vs cafe\u0301", "na\u00efve r\u00e9sum\u00e9 fa\u00e7ade", "Stra\u00dfe GR\u00dcSSE \u00c4rger",
         "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5", "Привет, мир! Как дела?",
         "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "你好，世界！", "こんにちは世界 カタカナ",
         "안녕하세요 세계", "😀 😃 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "🇺🇸🇯🇵🇩🇪", "e\u0301\u0302\u0303 a\u0308",
         "a\u200bb\u200cc\u200dd", "a\u00a0b", "a\u3000b", "a\u2003b\u2009c\u202fd", "x\u180ey", "line1\r\nline2\r\n",
         "\r\r\n\n \n", "abc123def 456ghi", "$$$ %%% ^^^ &&& ***", "<html><body>x</body></html>",
         "∑∫√∞ ≠ ≤ ≥ ±", "ＡＢＣ１２３ ｶﾀｶﾅ", "ﬁ ﬂ ﬀ", "x² H₂O ½ Ⅻ ①", "İstanbul ΣΊΣΥΦΟΣ",
         "   \t  \n  mixed   \t whitespace \n\n  ", "a" * 300, "ab " * 120, " " * 200, "1234567890" * 30,
         "\u2581 already has a metaspace \u2581\u2581x", "<0x41> looks like a byte token", "tab\there",
         "end with newline\n", "\x00\x01\x1f control", "\ufeffBOM", "\U0001F600" * 20]
    return t


def long_text(rng):
    pool = ("The quick brown fox jumps over the lazy dog. 1234 calibrated FP8 scales, per-layer KV cache; "
            "naïve café 你好世界 😀👩‍💻 Привет мир\n\n    indented code();\t\ttabs\r\n").split(" ")
    return " ".join(rng.choice(pool) for _ in range(400))


def random_texts(rng, n=30):
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()[]{}<>-_/\\@#$%^&*+=~`|")
            + list("  \t\n\r") + ["\u00e9", "\u00df", "\u00f1", "\u0301", "\u0308", "\u4e2d", "\u6587", "\u3042",
                                  "\uac00", "\u0416", "\u03a9", "\u05d0", "\u0627", "\u0915", "\u094d", "\u0e01",
                                  "\U0001F600", "\U0001F44D", "\U0001F3FD", "\u200d", "\u2581", "\u00a0", "\u3000",
                                  "\uff21", "\ufb01", "\u2460", "\U00010348", "\ufffd"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def specific_texts(name, tok):
    added = [a.content for a in tok.get_added_tokens_decoder().values()]
    out = []
    for a in added:
        out += [a, f"Hello{a}world", f"Hello {a} world", f"x   {a}   y", f"{a}{a}", f"\n{a}\n", f"cat {a}."]
    out += ["cat concat cat. cats _cat cat_", " [LSTRIP]x", "a    [LSTRIP]   b", "a [RSTRIP]    b",
            "say hello world, hello  world", "a <tool> b", "caf\u00e9 cafe\u0301 CAF\u00c9", "[INST] hi [/INST]",
            "<s>[INST] hi [/INST] ok</s>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "<think>\nhmm\n</think>\n\nanswer", "HELLO Hello hello", "a<SEP>b a <SEP> b", "<|begin_of_text|>x",
            "<start_of_turn>user\nhi<end_of_turn>"]
    return out


# ------------------------------------------------------------------ main ----
def encode_ids(tok, text, special):
    return tok.encode(text, add_special_tokens=special).ids


def load_auto(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    lines, total = corpus_texts()
    print(f"corpus: {len(lines)} lines, {total} chars", file=sys.stderr)
    bl_vocab, bl_merges = train_bytelevel(lines)
    sp_vocab, sp_merges = train_sentencepiece_like(lines)
    built = build_all(bl_vocab, bl_merges, sp_vocab, sp_merges)

    rng = random.Random(20240601)
    common = base_texts() + [long_text(rng), long_text(rng)] + random_texts(rng)
    manifest = {"tokenizers_version": tokenizers.__version__, "entries": []}
    try:
        import transformers
        manifest["transformers_version"] = transformers.__version__
    except ImportError:
        manifest["transformers_version"] = None
    summary = []
    for name, (tok, merges_as_strings, dir_cfg) in built.items():
        js = json.loads(tok.to_str())
        if merges_as_strings:
            js["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in js["model"]["merges"]]
        tok = Tokenizer.from_str(json.dumps(js))  # what is on disk is what we test
        if dir_cfg is None:
            rel = f"{name}/tokenizer.json"
        else:
            rel = name
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(js, f, ensure_ascii=False, separators=(",", ":"))
        texts = common + specific_texts(name, tok)
        vocab_n = tok.get_vocab_size(with_added_tokens=True)
        drng = random.Random(sum(map(ord, name)))
        rand_ids = [[drng.randrange(0, vocab_n) for _ in range(drng.randint(1, 24))] for _ in range(40)]
        added_ids = sorted(tok.get_added_tokens_decoder().keys())
        rand_ids += [[drng.choice(added_ids + list(range(0, min(vocab_n, 400)))) for _ in range(8)] for _ in range(15)]
        kind = "file"
        lib = f"tokenizers {tokenizers.__version__}"
        enc = lambda t, s: encode_ids(tok, t, s)
        dec = lambda ids, skip: tok.decode(ids, skip_special_tokens=skip)
        if dir_cfg is not None:
            cfg = dict(dir_cfg)
            cfg.setdefault("clean_up_tokenization_spaces", False)
            cfg.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
            cfg.setdefault("model_max_length", 1000000)
            with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(cfg, f, ensure_ascii=False, indent=1)
            try:
                hf = load_auto(d)
            except Exception as e:  # older/newer class names
                print(f"{name}: AutoTokenizer failed with PreTrainedTokenizerFast ({e!r}); retrying with "
                      f"TokenizersBackend", file=sys.stderr)
                cfg["tokenizer_class"] = "TokenizersBackend"
                with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                    json.dump(cfg, f, ensure_ascii=False, indent=1)
                hf = load_auto(d)
            kind = "dir"
            lib = f"transformers {manifest['transformers_version']} ({type(hf).__name__})"
            enc = lambda t, s: list(hf.encode(t, add_special_tokens=s))
            dec = lambda ids, skip: hf.decode(ids, skip_special_tokens=skip)
        cases, dcases = run_cases(enc, dec, texts, rand_ids)
        doc = {"name": name, "kind": kind, "path": rel, "reference": lib, "cases": cases, "decode_cases": dcases}
        write_gz(os.path.join(OUT, f"{name}.cases.json.gz"), json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
        manifest["entries"].append({"name": name, "kind": kind, "path": rel, "cases": f"{name}.cases.json.gz",
                                    "reference": lib})
        summary.append((name, kind, len(cases), len(dcases), vocab_n, lib))
    with open(os.path.join(OUT, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    size = 0
    for root, _, files in os.walk(OUT):
        size += sum(os.path.getsize(os.path.join(root, x)) for x in files)
    print(f"{'name':24} {'kind':5} {'cases':>6} {'dec':>5} {'vocab':>6}  reference")
    for s in summary:
        print(f"{s[0]:24} {s[1]:5} {s[2]:6d} {s[3]:5d} {s[4]:6d}  {s[5]}")
    print(f"wrote {OUT} ({size / 1e6:.2f} MB)")
    if size > 2_000_000:
        print("WARNING: goldens exceed 2 MB; lower vocab sizes or the long/random text counts", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Train fp8kv's bundled models from scratch on the GPU machine (PyTorch +
transformers 5 + tokenizers), with transformers' own model classes:

  --arch qwen3 (default): models/fp8kv-mini, a ~10.5M-parameter hybrid Qwen3
      (5 sliding : 1 full attention):

  PYTHONUNBUFFERED=1 python3 tools/train_bundled.py --corpus corpus \
      --out models/fp8kv-mini --minutes 5.5 --export-dir "$OUT"

  --arch qwen3_5: models/fp8kv-mini-gdn, a ~5.9M-parameter Qwen3_5ForCausalLM
      (model_type qwen3_5_text): 3 Gated DeltaNet (linear_attention) layers per
      gated full-attention layer, q/k norm, partial rotary; the fp8kv-mini
      tokenizer (--tokenizer) and the same corpus:

  PYTHONUNBUFFERED=1 python3 tools/train_bundled.py --arch qwen3_5 --corpus corpus \
      --tokenizer models/fp8kv-mini --out models/fp8kv-mini-gdn --export-dir "$OUT" \
      --minutes 6 --deadline-minutes 9.0

Steps: (1) train a byte-level BPE tokenizer (Qwen2 split regex + ByteLevel,
<|endoftext|> = eos = id 0) on corpus/train.txt only, or with --tokenizer DIR
copy DIR's tokenizer.json / tokenizer_config.json / chat_template.jinja;
(2) tokenize; (3) build a pool of needle-in-a-haystack examples
(docs/design.md "Needle prompts") whose passkey digits are re-drawn every time
a row is used; (4) train under a hard wall-clock budget (--minutes), saving a
bf16 checkpoint every --ckpt-seconds to --out and --export-dir; (5) reload the
saved bf16 model with from_pretrained, measure held-out perplexity and greedy
needle accuracy at 1K/2K/4K tokens, write summary.json.

qwen3_5: transformers runs the Gated DeltaNet layers through
flash-linear-attention (fla) when it is installed, else through its torch path
(torch_chunk_gated_delta_rule); the script logs which. The torch path's core
runs in fp32 with autocast off (as in the bf16 evaluation, where it casts to
fp32 itself). The saved config.json is checked against the fields fp8kv reads
(tests/golden/models_qwen3_5/*/config.json) and gets "attn_output_gate": true.

--dry-run exercises the pure-Python parts (document split, needle text
generation, eval prompt construction, the parameter count of --arch's shape)
without importing torch. --smoke (GPU, ~1 min) builds the model, runs 3
optimizer steps on tiny batches (one 4096-token sequence among them) and a
short throughput probe at the real batch size, saves a checkpoint (to
--out + "-smoke", exported to $OUT/<name>-smoke), reloads it with
from_pretrained, checks it, and runs a shortened evaluation.
"""
import argparse
import copy
import functools
import importlib.util
import json
import math
import os
import random
import re
import shutil
import sys
import time

DOC_SEP = "<|endoftext|>"
NEEDLE = "The passkey is {k}. Remember it. {k} is the passkey."
QUESTION = "What is the passkey? The passkey is"
# Qwen2's pre-tokenizer split pattern (digits split one by one).
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ------------------------------------------------------------ pure Python part
def read_docs(path):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    return [d.strip("\n") for d in raw.split("\n" + DOC_SEP + "\n") if d.strip()]


def passkey(rng):
    return "".join(rng.choice("0123456789") for _ in range(5))


def insert_needle(hay, depth, key, rng=None, sentence=True, sep=" "):
    """Insert the needle sentence into hay at fraction `depth` (snapped forward
    to the next sentence end when sentence=True, else to whitespace). Returns
    (text, char offsets of the 10 passkey digits' starts...)."""
    pos = int(len(hay) * depth)
    if sentence:
        m = re.compile(r"[.!?]\s").search(hay, pos)
        pos = m.start() + 1 if m else len(hay)
    else:
        m = re.compile(r"\s").search(hay, pos)
        pos = m.start() if m else len(hay)
    before, after = hay[:pos].rstrip(), hay[pos:].lstrip()
    needle = NEEDLE.format(k=key)
    pre = before + (sep if before else "")
    text = pre + needle + (sep if after else "") + after
    k1 = len(pre) + needle.index(key)
    k2 = len(pre) + needle.rindex(key)
    return text, [k1, k2]


def needle_prompt(hay, depth, key, rng=None, sentence=True, sep=" ", qsep="\n\n"):
    """Canonical prompt (the format `fp8kv eval niah` should use):
    haystack with the needle inserted, then qsep + QUESTION. Returns
    (prompt, key char offsets)."""
    text, offs = insert_needle(hay, depth, key, rng, sentence, sep)
    return text.rstrip() + qsep + QUESTION, offs


def training_needle_text(rng, hay):
    """A training example: random separators around the needle/question so the
    model does not over-fit one layout; the canonical layout is the most
    common. Returns (text, offsets of the 15 passkey digit chars)."""
    key = passkey(rng)
    sentence = rng.random() < 0.6
    sep = rng.choice([" ", " ", " ", "\n", "\n\n"])
    qsep = rng.choice(["\n\n", "\n\n", "\n", " ", "\n\n\n"])
    prompt, offs = needle_prompt(hay, rng.random(), key, rng, sentence, sep, qsep)
    text = prompt + " " + key
    offs = offs + [len(prompt) + 1]
    digits = [o + i for o in offs for i in range(5)]
    assert all(text[d].isdigit() for d in digits), "passkey offsets"
    return text, key, digits


def haystack_from_docs(rng, docs, nchars):
    """Concatenate random documents (random start) up to nchars characters."""
    parts, n = [], 0
    while n < nchars:
        d = rng.choice(docs)
        if len(d) > nchars - n:
            s = rng.randrange(0, max(1, len(d) - (nchars - n)))
            m = re.compile(r"\n\n|\. ").search(d, s)
            s = m.end() if m and m.end() < len(d) - 200 else s
            d = d[s:s + (nchars - n)]
        parts.append(d)
        n += len(d) + 2
    return "\n\n".join(parts)[:nchars]


# ------------------------------------------------------------ architectures
LIN, FULL = "linear_attention", "full_attention"
# Per-arch defaults of the options left unset on the command line. qwen3's are
# the values fp8kv-mini was trained with (its README's command is unchanged).
ARCH_DEFAULTS = {
    "qwen3": dict(out="models/fp8kv-mini", layers=6, full_every=6, hidden=384, ffn=640, heads=8, kv_heads=2,
                  head_dim=64, window=512, tokenizer="", eval_dir="", lr=2e-3, warmup=200,
                  tokens_per_step=65536, seq_mix="512:0.15,1024:0.35,2048:0.25,4096:0.25",
                  eval_reserve=75.0, log_every=100, max_mb=0.0),
    # 8 layers [L, L, L, F] x 2; 5,923,952 parameters = 11.85 MB of bf16 (one shard).
    "qwen3_5": dict(out="models/fp8kv-mini-gdn", layers=8, full_every=4, hidden=192, ffn=512, heads=4,
                    kv_heads=2, head_dim=128, linear_key_heads=2, linear_value_heads=4, linear_key_dim=64,
                    linear_value_dim=64, conv_kernel=4, partial_rotary=0.25, tokenizer="models/fp8kv-mini",
                    eval_dir="models/fp8kv-mini/eval", lr=2e-3, warmup=100, tokens_per_step=65536,
                    seq_mix="512:0.10,1024:0.30,2048:0.30,4096:0.30", eval_reserve=150.0, log_every=25,
                    max_mb=12.0),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# A config.json that fp8kv loads (tests/golden/models_qwen3_5/l3f1_hd64/config.json).
GDN_GOLDEN_CONFIG = os.path.join("tests", "golden", "models_qwen3_5", "l3f1_hd64", "config.json")


def apply_arch_defaults(a):
    for k, v in ARCH_DEFAULTS[a.arch].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if a.arch == "qwen3" and a.smoke:
        sys.exit("--smoke is for --arch qwen3_5 (qwen3: fp8kv-mini's own run)")


def layer_types_of(a):
    other = "sliding_attention" if a.arch == "qwen3" else LIN
    return [FULL if (i + 1) % a.full_every == 0 else other for i in range(a.layers)]


def parse_seq_mix(s):
    mix = []
    for part in s.split(","):
        L, w = part.split(":")
        mix.append((int(L), float(w)))
    assert mix and all(L > 1 and w > 0 for L, w in mix), s
    return mix


def param_count(a):
    """Parameters of the transformers model --arch builds (tied embeddings:
    the LM head is the embedding), by tensor, without torch."""
    H, V, I = a.hidden, a.vocab, a.ffn
    n = V * H + H  # embed_tokens + final norm
    mlp = 3 * H * I + 2 * H  # gate, up, down + input/post-attention norms
    Hq, Hkv, D = a.heads, a.kv_heads, a.head_dim
    gate = 2 if a.arch == "qwen3_5" else 1  # Qwen3.5's q_proj writes [query | gate] per head
    attn = H * Hq * D * gate + 2 * H * Hkv * D + Hq * D * H + 2 * D  # q, k, v, o, q_norm, k_norm
    for t in layer_types_of(a):
        if t == LIN:
            kd, vd = a.linear_key_heads * a.linear_key_dim, a.linear_value_heads * a.linear_value_dim
            conv = 2 * kd + vd
            n += (H * conv + H * vd + 2 * H * a.linear_value_heads  # in_proj_qkv, in_proj_z, in_proj_b/a
                  + conv * a.conv_kernel + 2 * a.linear_value_heads  # conv1d, A_log, dt_bias
                  + a.linear_value_dim + vd * H)                     # gated norm, out_proj
        else:
            n += attn
        n += mlp
    return n


def describe_shape(a):
    lt = layer_types_of(a)
    s = (f"arch {a.arch}: vocab {a.vocab} (tied), hidden {a.hidden}, ffn {a.ffn}, {a.layers} layers "
         f"{''.join('F' if t == FULL else ('S' if t == 'sliding_attention' else 'L') for t in lt)}, "
         f"attention {a.heads} q / {a.kv_heads} kv heads x head_dim {a.head_dim}")
    if a.arch == "qwen3_5":
        s += (f" (output gate, partial rotary {a.partial_rotary}: {int(a.head_dim * a.partial_rotary)} dims), "
              f"GDN {a.linear_key_heads} key heads x {a.linear_key_dim}, {a.linear_value_heads} value heads x "
              f"{a.linear_value_dim}, conv {a.conv_kernel}")
    else:
        s += f", sliding window {a.window}"
    return s + f", context {a.context}"


def check_budget(a, nparams):
    mb = nparams * 2 / 1e6
    if a.max_mb and mb > a.max_mb:
        sys.exit(f"{nparams:,d} parameters = {mb:.2f} MB of bf16 > --max-mb {a.max_mb}")
    return mb


def gdn_config_fields(a, eos):
    """What config.json must say for fp8kv (beside what transformers writes)."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": a.vocab,
        "hidden_size": a.hidden, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
        "max_position_embeddings": a.context, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "tie_word_embeddings": True, "attention_bias": False, "layer_types": layer_types_of(a),
        "linear_conv_kernel_dim": a.conv_kernel, "linear_key_head_dim": a.linear_key_dim,
        "linear_value_head_dim": a.linear_value_dim, "linear_num_key_heads": a.linear_key_heads,
        "linear_num_value_heads": a.linear_value_heads, "eos_token_id": eos, "dtype": "bfloat16",
        "attn_output_gate": True,
    }


def finalize_gdn_config(path, a, eos):
    """Check the config.json transformers wrote against what fp8kv reads: a
    field transformers left out is added (attn_output_gate: transformers'
    Qwen3.5 attention is always gated and has no such field); one it wrote
    with another value is an error. Returns the fields added."""
    with open(path) as f:
        c = json.load(f)
    want = gdn_config_fields(a, eos)
    added, bad = [], []
    for k, v in want.items():
        if k not in c or c[k] is None:
            c[k] = v
            added.append(k)
        elif c[k] != v and not (isinstance(v, float) and isinstance(c[k], (int, float)) and abs(c[k] - v) < 1e-12):
            bad.append(f"{k}: {c[k]!r} (want {v!r})")
    rope_key = "rope_parameters" if c.get("rope_parameters") else ("rope_scaling" if c.get("rope_scaling") else None)
    if rope_key is None:
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": a.rope_theta,
                                "partial_rotary_factor": a.partial_rotary}
        added.append("rope_parameters")
    else:
        rp = c[rope_key]
        partial = rp.get("partial_rotary_factor", c.get("partial_rotary_factor"))
        if partial != a.partial_rotary or rp.get("rope_type", rp.get("type")) != "default" or \
                float(rp.get("rope_theta", c.get("rope_theta", -1))) != float(a.rope_theta):
            bad.append(f"{rope_key}: {rp!r}")
    if bad:
        raise RuntimeError(f"{path}: fields fp8kv reads differ from the intended model: " + "; ".join(bad))
    if os.path.exists(GDN_GOLDEN_CONFIG):  # every field of a config fp8kv loads is there
        with open(GDN_GOLDEN_CONFIG) as f:
            golden = json.load(f)
        missing = sorted(k for k in golden if k not in c and k != "bos_token_id")
        if missing:
            raise RuntimeError(f"{path}: lacks fields of {GDN_GOLDEN_CONFIG}: {missing}")
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    return added


def dry_run(a):
    rng = random.Random(0)
    tr = read_docs(os.path.join(a.corpus, "train.txt"))
    ho = read_docs(os.path.join(a.corpus, "heldout.txt"))
    print(f"train docs {len(tr)} ({sum(map(len, tr)):,d} chars), heldout docs {len(ho)} "
          f"({sum(map(len, ho)):,d} chars)")
    trs = set(tr)
    overlap = sum(1 for d in ho if d in trs)
    print(f"held-out docs that also occur in train: {overlap}")
    assert overlap == 0
    for i in range(3):
        hay = haystack_from_docs(rng, tr, rng.choice([1000, 4000, 16000]))
        text, key, digits = training_needle_text(rng, hay)
        print(f"--- example {i}: key {key}, {len(text)} chars, digits at {digits[:5]}..{digits[-5:]}")
        j = text.index("The passkey is")
        print(repr(text[max(0, j - 120): j + 120]))
        print("tail:", repr(text[-120:]))
    hay_path = os.path.join(eval_dir_of(a), "haystack.txt")
    if os.path.exists(hay_path):
        hay = open(hay_path, encoding="utf-8").read()
        p, offs = needle_prompt(hay[:4000], 0.5, "12345")
        print("eval prompt tail:", repr(p[-100:]), "needle at", offs)
    elif a.arch == "qwen3_5":
        sys.exit(f"no {hay_path}: --eval-dir must hold haystack.txt and heldout_N.txt")
    # the model's shape and size
    print(describe_shape(a))
    print("layer_types", layer_types_of(a))
    for L, w in parse_seq_mix(a.seq_mix):
        assert L <= a.context and a.tokens_per_step // L >= 1, (L, a.tokens_per_step)
    assert a.context in [L for L, _ in parse_seq_mix(a.seq_mix)], "the sequence mix must include --context"
    n = param_count(a)
    print(f"parameters {n:,d} = {n * 2:,d} bytes of bf16 ({check_budget(a, n):.2f} MB"
          f"{f', limit {a.max_mb} MB' if a.max_mb else ''})")
    if a.arch == "qwen3_5":
        assert a.layers >= 8 and a.full_every == 4, "3 linear : 1 full, at least 8 layers"
        rot = a.head_dim * a.partial_rotary
        assert rot >= 2 and rot == int(rot) and int(rot) % 2 == 0, "rotary dims must be even"
        assert a.linear_value_heads % a.linear_key_heads == 0
        fields = gdn_config_fields(a, 0)
        if os.path.exists(GDN_GOLDEN_CONFIG):
            golden = json.load(open(GDN_GOLDEN_CONFIG))
            missing = sorted(k for k in golden if k not in fields and k not in ("bos_token_id", "rope_parameters"))
            assert not missing, f"config fields of {GDN_GOLDEN_CONFIG} not set: {missing}"
            print(f"config fields cover {GDN_GOLDEN_CONFIG}'s {len(golden)} keys")
    if a.tokenizer:
        tj = os.path.join(a.tokenizer, "tokenizer.json")
        t = json.load(open(tj, encoding="utf-8"))
        vocab = t["model"]["vocab"]
        n_tok = len(set(vocab.values()) | {x["id"] for x in t.get("added_tokens", [])})
        digits = [vocab.get(str(d)) for d in range(10)]
        print(f"tokenizer {tj}: {n_tok} tokens, eos {vocab.get(DOC_SEP)}, digits {digits}; files "
              f"{[f for f in TOKENIZER_FILES if os.path.exists(os.path.join(a.tokenizer, f))]}")
        assert n_tok == a.vocab and vocab.get(DOC_SEP) == 0 and None not in digits
    print("dry run OK")


def eval_dir_of(a):
    return a.eval_dir or os.path.join(a.out, "eval")


# ------------------------------------------------------------ torch part
def train_tokenizer(a, train_path, out_dir):
    from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, show_progress=False,
                                  special_tokens=[DOC_SEP],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def it():
        for d in read_docs(train_path):
            yield d
    tok.train_from_iterator(it(), trainer)
    try:
        from transformers import PreTrainedTokenizerFast as TokCls
    except ImportError:  # transformers 5 renamed the class
        from transformers import TokenizersBackend as TokCls
    hf = TokCls(tokenizer_object=tok, eos_token=DOC_SEP, pad_token=DOC_SEP,
                model_max_length=a.context, clean_up_tokenization_spaces=False)
    hf.save_pretrained(out_dir)
    return hf


def setup_tokenizer(a, train_path):
    """The tokenizers.Tokenizer of the model, its files in a.out: trained on
    the training split, or copied from --tokenizer DIR."""
    if not a.tokenizer:
        hf_tok = train_tokenizer(a, train_path, a.out)
        return hf_tok.backend_tokenizer if hasattr(hf_tok, "backend_tokenizer") else hf_tok._tokenizer
    from tokenizers import Tokenizer
    for f in TOKENIZER_FILES:
        src, dst = os.path.join(a.tokenizer, f), os.path.join(a.out, f)
        if not os.path.exists(src):
            if f != "chat_template.jinja":
                sys.exit(f"--tokenizer {a.tokenizer}: no {f}")
            continue
        if not (os.path.exists(dst) and os.path.samefile(src, dst)):
            shutil.copy2(src, dst)
    tok = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json"))
    log(f"tokenizer copied from {a.tokenizer} (not trained)")
    return tok


def model_classes(arch):
    import transformers
    if arch == "qwen3":
        return transformers.Qwen3Config, transformers.Qwen3ForCausalLM
    return transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM


def build_config(a, eos):
    Cfg, _ = model_classes(a.arch)
    layer_types = layer_types_of(a)
    common = dict(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim, hidden_act="silu", max_position_embeddings=a.context,
        initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True, tie_word_embeddings=True,
        attention_bias=False, layer_types=layer_types, attention_dropout=0.0,
        bos_token_id=None, eos_token_id=eos, pad_token_id=eos,
    )
    if a.arch == "qwen3":
        cfg = Cfg(**common, rope_parameters={"rope_type": "default", "rope_theta": a.rope_theta},
                  use_sliding_window=True, sliding_window=a.window,
                  # layer_types is authoritative in transformers >= 4.53; max_window_layers is
                  # only used to derive layer_types when they are absent: 0 = "any layer may slide".
                  max_window_layers=0)
        assert cfg.sliding_window == a.window and list(cfg.layer_types) == layer_types, \
            (cfg.sliding_window, cfg.layer_types)
        return cfg, layer_types
    cfg = Cfg(**common,
              rope_parameters={"rope_type": "default", "rope_theta": a.rope_theta,
                               "partial_rotary_factor": a.partial_rotary},
              linear_conv_kernel_dim=a.conv_kernel, linear_key_head_dim=a.linear_key_dim,
              linear_value_head_dim=a.linear_value_dim, linear_num_key_heads=a.linear_key_heads,
              linear_num_value_heads=a.linear_value_heads)
    rp = cfg.rope_parameters
    assert list(cfg.layer_types) == layer_types, cfg.layer_types
    assert rp.get("partial_rotary_factor") == a.partial_rotary and rp.get("rope_type") == "default" and \
        float(rp.get("rope_theta")) == float(a.rope_theta), rp
    assert cfg.tie_word_embeddings and cfg.head_dim == a.head_dim and \
        cfg.linear_num_value_heads == a.linear_value_heads, cfg
    return cfg, layer_types


def gdn_kernel_paths(torch):
    """Which implementations transformers' Qwen3.5 Gated DeltaNet calls, and
    (torch path) run its chunked core in fp32 with autocast off: under bf16
    autocast its matmuls (the UT system it inverts, the chunk-to-chunk state
    updates) would round to bf16, unlike the bf16 evaluation, where the core
    casts everything to fp32 itself and autocast is off."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as mq
    info = {}
    avail = None
    for where in ("transformers.utils.import_utils", "transformers.utils"):
        try:
            avail = getattr(__import__(where, fromlist=["x"]), "is_flash_linear_attention_available")
            break
        except (ImportError, AttributeError):
            continue
    info["is_flash_linear_attention_available"] = bool(avail()) if avail else "not in this transformers"
    for pkg in ("fla", "causal_conv1d", "kernels"):
        try:
            info[pkg + " installed"] = importlib.util.find_spec(pkg) is not None
        except (ImportError, ValueError):
            info[pkg + " installed"] = False

    def where(f):
        f = getattr(f, "__wrapped__", f)
        return f"{getattr(f, '__module__', type(f).__module__)}.{getattr(f, '__qualname__', type(f).__name__)}"
    for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
               "causal_conv1d_update"):
        info[fn] = where(getattr(mq, fn)) if hasattr(mq, fn) else "absent"
    chunk = getattr(mq, "torch_chunk_gated_delta_rule", None)
    torch_path = chunk is not None and "modeling_qwen3_5" in where(chunk)
    info["delta rule path"] = "transformers torch (torch_chunk_gated_delta_rule)" if torch_path else \
        "fla / kernel: " + info.get("torch_chunk_gated_delta_rule", "?")
    conv_torch = "modeling_qwen3_5" in info.get("causal_conv1d_fn", "modeling_qwen3_5")
    info["conv path"] = "transformers torch (F.conv1d)" if conv_torch else "causal_conv1d: " + info["causal_conv1d_fn"]
    if torch_path and not getattr(chunk, "_fp8kv_fp32", False):
        @functools.wraps(chunk)
        def chunk_fp32(*args, **kwargs):
            chunk_fp32.calls += 1
            with torch.autocast("cuda", enabled=False):
                return chunk(*args, **kwargs)
        chunk_fp32._fp8kv_fp32 = True
        chunk_fp32.calls = 0
        mq.torch_chunk_gated_delta_rule = chunk_fp32
        info["delta rule core"] = "fp32, autocast off (patched: modeling_qwen3_5.torch_chunk_gated_delta_rule)"
    return info, torch_path


def patch_gdn_modules(model):
    """Modules that bound the delta-rule function at construction (older
    transformers: self.chunk_gated_delta_rule) get the fp32 core too."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as mq
    n = 0
    for mod in model.modules():
        f = getattr(mod, "chunk_gated_delta_rule", None)
        if f is not None and getattr(f, "__name__", "") == "torch_chunk_gated_delta_rule" and \
                not getattr(f, "_fp8kv_fp32", False):
            mod.chunk_gated_delta_rule = mq.torch_chunk_gated_delta_rule
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=sorted(ARCH_DEFAULTS), default="qwen3",
                    help="qwen3: fp8kv-mini (Qwen3ForCausalLM, sliding + full attention); qwen3_5: fp8kv-mini-gdn "
                         "(Qwen3_5ForCausalLM, Gated DeltaNet + gated full attention). Options left unset take "
                         "the arch's defaults (ARCH_DEFAULTS)")
    ap.add_argument("--corpus", default="corpus")
    ap.add_argument("--out", default=None, help="model folder (qwen3: models/fp8kv-mini; qwen3_5: models/fp8kv-mini-gdn)")
    ap.add_argument("--export-dir", default=os.environ.get("OUT", ""),
                    help="copy checkpoints + summary here (the GPU machine's $OUT)")
    ap.add_argument("--tokenizer", default=None,
                    help="copy this folder's tokenizer.json / tokenizer_config.json / chat_template.jinja instead "
                         "of training a tokenizer (qwen3_5 default: models/fp8kv-mini; '' trains one)")
    ap.add_argument("--eval-dir", default=None,
                    help="heldout_N.txt + haystack.txt (qwen3: OUT/eval; qwen3_5: models/fp8kv-mini/eval)")
    ap.add_argument("--minutes", type=float, default=5.5, help="training-loop wall-clock budget")
    ap.add_argument("--deadline-minutes", type=float, default=9.0,
                    help="whole-script budget: training stops early so eval ends before this")
    ap.add_argument("--eval-reserve", type=float, default=None,
                    help="seconds kept for saving + evaluation before --deadline-minutes (qwen3 75, qwen3_5 150)")
    ap.add_argument("--ckpt-seconds", type=float, default=60)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--full-every", type=int, default=None, help="every Nth layer is full attention")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--ffn", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=None)
    ap.add_argument("--window", type=int, default=None, help="qwen3: sliding window")
    ap.add_argument("--linear-key-heads", type=int, default=None, help="qwen3_5: linear_num_key_heads")
    ap.add_argument("--linear-value-heads", type=int, default=None, help="qwen3_5: linear_num_value_heads")
    ap.add_argument("--linear-key-dim", type=int, default=None, help="qwen3_5: linear_key_head_dim")
    ap.add_argument("--linear-value-dim", type=int, default=None, help="qwen3_5: linear_value_head_dim")
    ap.add_argument("--conv-kernel", type=int, default=None, help="qwen3_5: linear_conv_kernel_dim")
    ap.add_argument("--partial-rotary", type=float, default=None, help="qwen3_5: partial_rotary_factor")
    ap.add_argument("--max-mb", type=float, default=None, help="fail when the bf16 weights exceed this (0: no limit)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--rope-theta", type=float, default=100000.0)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--tokens-per-step", type=int, default=None)
    ap.add_argument("--seq-mix", default=None,
                    help="sequence lengths and their share of steps, 'L:w,...' (qwen3 "
                         "512:0.15,1024:0.35,2048:0.25,4096:0.25; qwen3_5 512:0.10,1024:0.30,2048:0.30,4096:0.30)")
    ap.add_argument("--log-every", type=int, default=None)
    ap.add_argument("--needle-frac", type=float, default=0.15)
    ap.add_argument("--needle-pool", type=int, default=3000)
    ap.add_argument("--needle-trials", type=int, default=20)
    ap.add_argument("--ppl-context", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="qwen3_5, GPU: build, 3 tiny optimizer steps (one 4096-token sequence) + a throughput "
                         "probe, save, reload, check, short eval; ~1 min")
    a = ap.parse_args()
    apply_arch_defaults(a)
    if a.dry_run:
        return dry_run(a)
    run(a)


def run(a):
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoTokenizer, GenerationConfig

    smoke = a.smoke
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {torch.cuda.get_device_name(0)}{' (SMOKE RUN)' if smoke else ''}")
    log(describe_shape(a))
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if smoke:
        a.out = a.out.rstrip("/") + "-smoke"
        a.needle_pool = 40
    os.makedirs(a.out, exist_ok=True)
    name = os.path.basename(os.path.normpath(a.out))
    exp_model = os.path.join(a.export_dir, name) if a.export_dir else ""
    summary_name = "smoke_summary.json" if smoke else "summary.json"
    train_path = os.path.join(a.corpus, "train.txt")
    held_path = os.path.join(a.corpus, "heldout.txt")
    seq_choices = parse_seq_mix(a.seq_mix)
    Cfg, Model = model_classes(a.arch)

    # 1. tokenizer --------------------------------------------------------
    tok = setup_tokenizer(a, train_path)
    eos = tok.token_to_id(DOC_SEP)
    digit_ids = [tok.token_to_id(str(d)) for d in range(10)]
    assert eos == 0 and None not in digit_ids, (eos, digit_ids)
    assert tok.get_vocab_size() == a.vocab, (tok.get_vocab_size(), a.vocab)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, eos {eos}, digits {digit_ids}")

    # 2. data -------------------------------------------------------------
    train_docs = read_docs(train_path)
    held_docs = read_docs(held_path)
    if smoke:  # a slice: enough for 4096-token rows and the needle pool
        train_docs, held_docs = train_docs[:400], held_docs[:2]
    ids = []
    for enc in tok.encode_batch(train_docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    data = torch.tensor(ids, dtype=torch.int32, device=dev)
    chars_per_tok = sum(map(len, train_docs)) / len(ids)
    log(f"train tokens {len(ids):,d} ({chars_per_tok:.2f} chars/token), docs {len(train_docs)}")
    del ids

    # 3. needle pool: lengths log-uniform in [256, context]; digits re-drawn per use
    texts, digit_offs = [], []
    for i in range(a.needle_pool):
        ntok = int(math.exp(rng.uniform(math.log(256), math.log(a.context))))
        hay = haystack_from_docs(rng, train_docs, int((ntok - 30) * chars_per_tok))
        t, _key, dig = training_needle_text(rng, hay)
        texts.append(t)
        digit_offs.append(dig)
    pool = []  # (tensor ids, tensor of 15 digit positions)
    for enc, dig in zip(tok.encode_batch(texts, add_special_tokens=False), digit_offs):
        start2idx = {s: j for j, (s, _e) in enumerate(enc.offsets)}
        pos = [start2idx.get(c) for c in dig]
        if None in pos or any(enc.ids[p] not in digit_ids for p in pos) or len(enc.ids) > a.context - 2:
            continue
        pool.append((torch.tensor(enc.ids, dtype=torch.int64, device=dev),
                     torch.tensor(pos, dtype=torch.int64, device=dev)))
    pool.sort(key=lambda x: len(x[0]))
    pool_lens = [len(p[0]) for p in pool]
    digit_t = torch.tensor(digit_ids, device=dev)
    log(f"needle pool {len(pool)} examples, tokens {pool_lens[0]}..{pool_lens[-1]}")
    del texts

    # 4. model ------------------------------------------------------------
    cfg, layer_types = build_config(a, eos)
    gdn_info, gdn_torch_path = {}, False
    if a.arch == "qwen3":
        sliding_selftest(torch, Model, cfg, dev)
    else:  # the sliding-window self-test is qwen3's; qwen3_5 has no sliding layers
        gdn_info, gdn_torch_path = gdn_kernel_paths(torch)
        for k, v in gdn_info.items():
            log(f"gdn: {k}: {v}")
    model = make_model(Model, cfg).to(dev)
    if a.arch == "qwen3_5" and gdn_torch_path:
        n = patch_gdn_modules(model)
        if n:
            log(f"gdn: fp32 core bound on {n} modules (self.chunk_gated_delta_rule)")
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos, do_sample=False)
    nparams = sum(p.numel() for p in model.parameters())
    want = param_count(a)
    log(f"model: {nparams:,d} params ({nparams * 2 / 1e6:.2f} MB bf16; shape formula {want:,d}), "
        f"layer_types {layer_types}, "
        f"{f'window {cfg.sliding_window}, ' if a.arch == 'qwen3' else ''}attn {model.config._attn_implementation}")
    assert nparams == want, f"transformers built {nparams:,d} parameters, the shape formula says {want:,d}"
    check_budget(a, nparams)
    save_model = make_model(Model, cfg).to(torch.bfloat16)
    save_model.generation_config = model.generation_config
    fwd = torch.compile(model) if a.compile else model

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    def save_ckpt(tag):
        t = time.time()
        with torch.no_grad():
            sd = {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items()}
            save_model.load_state_dict(sd, strict=False)
        tmp = a.out.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            save_model.save_pretrained(tmp, max_shard_size="15MB")
        except TypeError as e:  # should not happen; keeps a model even if the API moved
            log(f"WARNING: save_pretrained(max_shard_size=...) failed ({e}); saving one file")
            save_model.save_pretrained(tmp)
        if a.arch == "qwen3_5":
            added = finalize_gdn_config(os.path.join(tmp, "config.json"), a, eos)
            if added:
                log(f"config.json: added {added}")
        for f in os.listdir(a.out):  # drop stale weight files
            if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".index.json")):
                os.remove(os.path.join(a.out, f))
        for f in os.listdir(tmp):
            os.replace(os.path.join(tmp, f), os.path.join(a.out, f))
        shutil.rmtree(tmp, ignore_errors=True)
        export()
        log(f"checkpoint ({tag}) saved in {time.time() - t:.1f}s: {sorted(os.listdir(a.out))}")

    def export():
        if not exp_model:
            return
        os.makedirs(exp_model, exist_ok=True)
        for f in os.listdir(exp_model):
            os.remove(os.path.join(exp_model, f))
        for f in model_files(a.out):
            shutil.copy2(os.path.join(a.out, f), os.path.join(exp_model, f))

    ar = {}

    def make_batch(L, B, needle_frac):
        """B rows of L tokens: random windows of the training stream; a row
        ends with a needle example (fresh digits) with probability needle_frac."""
        if L not in ar:
            ar[L] = torch.arange(L, device=dev)
        starts = torch.randint(0, data.numel() - L - 1, (B,), device=dev)
        x = data[starts[:, None] + ar[L][None, :]].long()
        rows = 0
        for r in range(B):
            if rng.random() >= needle_frac:
                continue
            hi = bisect_right(pool_lens, L - 1)
            if hi == 0:
                continue
            ex, pos = pool[rng.randrange(hi)]
            n = len(ex)
            ex = ex.clone()
            ex[pos] = digit_t[torch.randint(0, 10, (5,), device=dev)].repeat(3)
            if n < L:
                x[r, L - n - 1] = eos
            x[r, L - n:] = ex
            rows += 1
        return x, rows

    def train_step(x, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(input_ids=x, labels=x, use_cache=False)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach(), gn

    if smoke:
        return smoke_run(a, torch, F, Model, AutoTokenizer, model, save_model, opt, make_batch, train_step, save_ckpt,
                         tok, held_docs, eos, dev, nparams, layer_types, gdn_info, exp_model, summary_name)

    # 5. train ------------------------------------------------------------
    t_start = time.time()
    budget = min(a.minutes * 60, a.deadline_minutes * 60 - (t_start - T0) - a.eval_reserve)
    log(f"training budget {budget:.0f}s (setup took {t_start - T0:.0f}s), sequence mix {seq_choices}, "
        f"{a.tokens_per_step} tokens per step")
    step, tokens_seen, needle_rows = 0, 0, 0
    loss_acc, loss_n, ema = torch.zeros((), device=dev), 0, None
    last_ckpt = time.time()
    model.train()
    while True:
        el = time.time() - t_start
        if el >= budget:
            break
        frac = el / budget
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        L = rng.choices([s for s, _ in seq_choices], [w for _, w in seq_choices])[0]
        L = min(L, a.context)
        B = max(1, a.tokens_per_step // L)
        x, rows = make_batch(L, B, a.needle_frac)
        needle_rows += rows
        loss, _gn = train_step(x, lr)
        step += 1
        tokens_seen += B * L
        loss_acc += loss
        loss_n += 1
        if step % 25 == 0:
            lv = (loss_acc / loss_n).item()
            ema = lv if ema is None else 0.7 * ema + 0.3 * lv
            loss_acc.zero_()
            loss_n = 0
            if step % a.log_every == 0:
                log(f"step {step} loss {lv:.3f} (ema {ema:.3f}) lr {lr:.2e} tokens {tokens_seen / 1e6:.1f}M "
                    f"({tokens_seen / max(1e-9, time.time() - t_start) / 1e6:.2f}M tok/s) needle rows {needle_rows}")
        if time.time() - last_ckpt >= a.ckpt_seconds:
            save_ckpt(f"step {step}")
            write_summary(a, exp_model, {"status": "training", "step": step, "tokens_seen": tokens_seen,
                                         "train_loss": ema, "params": nparams}, summary_name)
            last_ckpt = time.time()
    train_secs = time.time() - t_start
    if loss_n:
        lv = (loss_acc / loss_n).item()
        ema = lv if ema is None else 0.7 * ema + 0.3 * lv
    log(f"training done: {step} steps, {tokens_seen:,d} tokens in {train_secs:.0f}s, loss ema {ema:.3f}")
    save_ckpt("final")
    del model, opt, fwd, data
    torch.cuda.empty_cache()

    # 6. evaluate the saved bf16 checkpoint -------------------------------
    m = Model.from_pretrained(a.out, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev).eval()
    tk = AutoTokenizer.from_pretrained(a.out)
    check_reloaded(a, m, layer_types)
    ev = evaluate(a, torch, F, m, tk, tok, held_docs, eos, dev, eval_dir_of(a), (1024, 2048, 4096),
                  a.needle_trials)

    summary = {
        "status": "done", "model": name, "arch": a.arch, "params": nparams,
        "config": summary_config(a, layer_types),
        "train": {"steps": step, "tokens_seen": tokens_seen, "seconds": round(train_secs, 1),
                  "final_train_loss_ema": round(ema, 4), "needle_rows": needle_rows,
                  "lr": a.lr, "tokens_per_step": a.tokens_per_step, "needle_frac": a.needle_frac,
                  "train_tokens": int(sum(map(len, train_docs)) / chars_per_tok)},
        "heldout_ppl": ev["heldout_ppl"],
        "needle": ev["needle"],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "total_seconds": round(time.time() - T0, 1),
        "files": model_files(a.out),
    }
    if a.arch == "qwen3":  # fp8kv-mini's summary keeps its original keys
        del summary["arch"]
    else:
        summary["train"]["seq_mix"] = seq_choices
        summary["train"]["warmup"] = a.warmup
        summary["gdn_paths"] = gdn_info
    with open(os.path.join(a.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    write_summary(a, exp_model, summary, summary_name)
    log("SUMMARY " + json.dumps({k: summary[k] for k in ("params", "heldout_ppl", "total_seconds")}))
    log("needle " + json.dumps({k: v["accuracy"] for k, v in ev["needle"].items()}))
    if exp_model:
        log(f"files to copy back: {a.export_dir}/{name}/* -> models/{name}/ : {sorted(os.listdir(exp_model))}; "
            f"{a.export_dir}/summary.json -> models/{name}/train_summary.json")


def summary_config(a, layer_types):
    c = {"layers": a.layers, "hidden": a.hidden, "ffn": a.ffn, "heads": a.heads,
         "kv_heads": a.kv_heads, "head_dim": a.head_dim, "layer_types": layer_types}
    if a.arch == "qwen3":
        c["sliding_window"] = a.window
    else:
        c.update(linear_num_key_heads=a.linear_key_heads, linear_num_value_heads=a.linear_value_heads,
                 linear_key_head_dim=a.linear_key_dim, linear_value_head_dim=a.linear_value_dim,
                 linear_conv_kernel_dim=a.conv_kernel, partial_rotary_factor=a.partial_rotary,
                 attn_output_gate=True)
    c.update(vocab=a.vocab, context=a.context, rope_theta=a.rope_theta)
    return c


def check_reloaded(a, m, layer_types):
    assert list(m.config.layer_types) == layer_types, m.config.layer_types
    if a.arch == "qwen3":
        assert m.config.sliding_window == a.window
    else:
        assert m.config.rope_parameters.get("partial_rotary_factor") == a.partial_rotary, m.config.rope_parameters
        assert m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr(), \
            "lm_head is not tied to embed_tokens after from_pretrained"


def evaluate(a, torch, F, m, tk, tok, held_docs, eos, dev, eval_dir, needle_lengths, trials, eval_files=None):
    """Held-out perplexity (split + eval_dir/heldout_N.txt) at --ppl-context and
    greedy needle accuracy at needle_lengths, on the reloaded bf16 model."""
    @torch.no_grad()
    def nll_chunks(ids, ctx):
        tot, cnt = 0.0, 0
        for i in range(0, len(ids), ctx):
            c = ids[i:i + ctx]
            if len(c) < 2:
                continue
            t = torch.tensor([c], device=dev)
            logits = m(input_ids=t, use_cache=False).logits.float()
            tot += F.cross_entropy(logits[0, :-1], t[0, 1:], reduction="sum").item()
            cnt += len(c) - 1
        return tot, cnt

    held_ids = []
    for enc in tok.encode_batch(held_docs, add_special_tokens=False):
        held_ids.extend(enc.ids + [eos])
    tot, cnt = nll_chunks(held_ids, a.ppl_context)
    held_ppl = math.exp(tot / cnt)
    log(f"held-out split: {cnt:,d} tokens, ppl {held_ppl:.3f} (bf16, context {a.ppl_context})")
    file_ppl = {}
    for f in sorted(os.listdir(eval_dir)) if os.path.isdir(eval_dir) else []:
        if f.startswith("heldout_") and f.endswith(".txt") and (eval_files is None or f in eval_files):
            ids_f = tk(open(os.path.join(eval_dir, f), encoding="utf-8").read())["input_ids"]
            t_, c_ = nll_chunks(ids_f, a.ppl_context)
            file_ppl[f] = {"tokens_scored": c_, "ppl": round(math.exp(t_ / c_), 4)}
            log(f"eval/{f}: {c_} tokens scored, ppl {math.exp(t_ / c_):.3f}")

    hay_path = os.path.join(eval_dir, "haystack.txt")
    hay_text = open(hay_path, encoding="utf-8").read() if os.path.exists(hay_path) else \
        "\n\n".join(d for d in held_docs)[:60000]
    hay_ids = tk(hay_text)["input_ids"]
    needle = {}
    nrng = random.Random(4321)
    for T in needle_lengths:
        ok, samples = 0, []
        for tr in range(trials):
            key = passkey(nrng)
            depth = (tr + 0.5) / trials
            keep = T - 8 - len(tk(" " + NEEDLE.format(k=key) + " \n\n" + QUESTION)["input_ids"])
            while True:
                prompt, _ = needle_prompt(tk.decode(hay_ids[:keep]), depth, key)
                p_ids = tk(prompt)["input_ids"]
                if len(p_ids) <= T - 7:
                    break
                keep -= len(p_ids) - (T - 7)
            gen = greedy(m, p_ids, 7, dev, torch)
            txt = tk.decode(gen)
            mm = re.match(r"\s*(\d{5})", txt)
            hit = bool(mm and mm.group(1) == key)
            ok += hit
            if len(samples) < 3:
                samples.append({"depth": round(depth, 3), "key": key, "prompt_tokens": len(p_ids), "output": txt})
        needle[str(T)] = {"trials": trials, "correct": ok, "accuracy": ok / trials,
                          "samples": samples}
        log(f"needle @{T}: {ok}/{trials}")
    return {"heldout_ppl": {"split_tokens": cnt, "ppl": round(held_ppl, 4), "context": a.ppl_context,
                            "dtype": "bfloat16", "files": file_ppl},
            "needle": needle}


def smoke_run(a, torch, F, Model, AutoTokenizer, model, save_model, opt, make_batch, train_step, save_ckpt,
              tok, held_docs, eos, dev, nparams, layer_types, gdn_info, exp_model, summary_name):
    """--smoke: 3 optimizer steps on tiny batches (one 4096-token row), a
    throughput probe at the real batch size, save, reload, check, short eval.
    Raises on any failure."""
    res = {"status": "smoke", "params": nparams, "bytes_bf16": nparams * 2, "gdn_paths": gdn_info, "steps": []}
    model.train()
    t_smoke = time.time()
    for i, (L, B) in enumerate([(256, 2), (a.context, 1), (1024, 2)]):
        x, rows = make_batch(L, B, 0.5)
        torch.cuda.synchronize()
        t = time.time()
        loss, gn = train_step(x, a.lr * 0.1)
        torch.cuda.synchronize()
        lv, gv = loss.item(), float(gn)
        log(f"smoke step {i + 1}: {B} x {L} tokens ({rows} needle rows), loss {lv:.3f}, grad norm {gv:.3f}, "
            f"{time.time() - t:.2f}s")
        assert math.isfinite(lv) and math.isfinite(gv), "non-finite loss or gradient"
        res["steps"].append({"B": B, "L": L, "loss": lv, "grad_norm": gv, "seconds": round(time.time() - t, 3)})
        if i == 0:  # every parameter got a gradient (A_log, dt_bias, conv1d, norms included)
            no_grad = [n for n, p in model.named_parameters() if p.grad is None]
            assert not no_grad, f"parameters without a gradient: {no_grad}"
            import transformers.models.qwen3_5.modeling_qwen3_5 as mq
            core = mq.torch_chunk_gated_delta_rule
            if getattr(core, "_fp8kv_fp32", False):  # the patched fp32 core is the one the layers call
                n_lin = sum(t == LIN for t in layer_types)
                log(f"gdn: fp32 core called {core.calls} times in step 1 ({n_lin} linear layers)")
                assert core.calls >= n_lin, "the layers do not call the patched torch_chunk_gated_delta_rule"
                res["gdn_fp32_core_calls_step1"] = core.calls
    # probe: the real run's batch size at the longest and a middle length
    probe = {}
    for L in sorted({a.context, 1024}, reverse=True):
        B = max(1, a.tokens_per_step // L)
        secs = []
        for _ in range(2):
            x, _r = make_batch(L, B, a.needle_frac)
            torch.cuda.synchronize()
            t = time.time()
            train_step(x, a.lr * 0.1)
            torch.cuda.synchronize()
            secs.append(time.time() - t)
        probe[str(L)] = {"B": B, "seconds_per_step": round(secs[-1], 3),
                         "tokens_per_second": round(B * L / secs[-1])}
        log(f"smoke probe {B} x {L}: {secs[-1]:.3f}s per step (first {secs[0]:.3f}s), "
            f"{B * L / secs[-1] / 1e6:.3f}M tok/s, peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    res["probe"] = probe
    res["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    save_ckpt("smoke")
    with open(os.path.join(a.out, "config.json")) as f:
        res["config_json"] = json.load(f)
    shards = [f for f in os.listdir(a.out) if f.startswith("model") and f.endswith(".safetensors")]
    sizes = {f: os.path.getsize(os.path.join(a.out, f)) for f in shards}
    log(f"weight files {sizes}")
    assert all(s < 16 * 2**20 for s in sizes.values()), "a shard is 16 MiB or more"
    res["weight_files"] = sizes
    # reload: the same bf16 tensors, tied head, a finite forward at the full context
    m = Model.from_pretrained(a.out, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev).eval()
    check_reloaded(a, m, layer_types)
    ref = save_model.state_dict()
    got = m.state_dict()
    diff = [k for k in ref if k not in got or not torch.equal(ref[k].to(dev).float(), got[k].float())]
    assert not diff, f"reloaded tensors differ from the saved ones: {diff[:8]}"
    x, _ = make_batch(a.context, 1, 1.0)
    with torch.no_grad():
        logits = m(input_ids=x, use_cache=False).logits.float()
    assert torch.isfinite(logits).all(), "non-finite logits after reload"
    log(f"reload OK: {len(got)} tensors equal, lm_head tied, logits finite over {a.context} tokens")
    try:  # information only (training and eval run without a cache): prefill + one recurrent decode step
        with torch.no_grad():
            out = m(input_ids=x[:, :-1], use_cache=True)
            step_logits = m(input_ids=x[:, -1:], past_key_values=out.past_key_values,
                            use_cache=True).logits.float()
        dl = (step_logits[0, -1] - logits[0, -1]).abs().max().item()
        log(f"cached decode (recurrent path) vs full forward at the last position: max |dlogit| {dl:.4f}")
        res["cached_decode_max_abs_dlogit"] = dl
    except Exception as e:  # noqa: BLE001
        log(f"WARNING: cached decode check failed: {e.__class__.__name__}: {e}")
        res["cached_decode_error"] = f"{e.__class__.__name__}: {e}"
    tk = AutoTokenizer.from_pretrained(a.out)
    assert tk(QUESTION)["input_ids"] == tok.encode(QUESTION, add_special_tokens=False).ids, "AutoTokenizer differs"
    ev = evaluate(a, torch, F, m, tk, tok, held_docs, eos, dev, eval_dir_of(a), (1024, a.context), 1,
                  eval_files={"heldout_1.txt"})
    res["eval"] = ev
    res["seconds"] = round(time.time() - T0, 1)
    res["train_smoke_seconds"] = round(time.time() - t_smoke, 1)
    with open(os.path.join(a.out, "smoke_summary.json"), "w") as f:
        json.dump(res, f, indent=1)
    write_summary(a, exp_model, res, summary_name)
    log(f"SMOKE OK in {time.time() - T0:.0f}s: params {nparams:,d} ({nparams * 2 / 1e6:.2f} MB bf16), "
        f"probe {json.dumps(probe)}")


def make_model(cls, cfg):
    try:
        return cls._from_config(cfg, attn_implementation="sdpa")
    except (TypeError, AttributeError):
        cfg._attn_implementation = "sdpa"
        return cls(cfg)


def bisect_right(xs, v):
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] <= v:
            lo = mid + 1
        else:
            hi = mid
    return lo


def greedy(m, ids, n, dev, torch):
    """Greedy decoding without a KV cache (full recompute: exact, and cheap at 10M params)."""
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = m(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits[0, -1]
            t = int(torch.argmax(logits.float()).item())
            out.append(t)
            ids.append(t)
    return out


def model_files(d):
    keep = ("config.json", "generation_config.json", "model.safetensors.index.json") + TOKENIZER_FILES
    return sorted(f for f in os.listdir(d)
                  if f in keep or (f.startswith("model") and f.endswith(".safetensors")))


def write_summary(a, exp_model, summary, fname="summary.json"):
    if a.export_dir:
        with open(os.path.join(a.export_dir, fname), "w") as f:
            json.dump(summary, f, indent=1)


def sliding_selftest(torch, Qwen3ForCausalLM, cfg, dev):
    """Check that the attention implementation used for training honours the
    sliding window: with one sliding layer of window w, changing token 0 must
    not change outputs at positions >= w; with one full layer it must."""
    w = 16
    for lt, expect_change in (("sliding_attention", False), ("full_attention", True)):
        c = copy.deepcopy(cfg)
        c.num_hidden_layers = 1
        c.layer_types = [lt]
        c.sliding_window = w
        mm = make_model(Qwen3ForCausalLM, c).to(dev).eval()
        x = torch.randint(1, cfg.vocab_size, (2, 64), device=dev)
        y = x.clone()
        y[:, 0] = (y[:, 0] % (cfg.vocab_size - 2)) + 1
        with torch.no_grad():  # fp32: outputs past the window must not move at all
            a_ = mm(input_ids=x, use_cache=False).logits.float()
            b_ = mm(input_ids=y, use_cache=False).logits.float()
        diff_far = (a_[:, w:] - b_[:, w:]).abs().max().item()
        diff_near = (a_[:, 1:w - 1] - b_[:, 1:w - 1]).abs().max().item()
        log(f"sliding self-test {lt}: max change at pos>={w}: {diff_far:.3g}, at pos<{w}: {diff_near:.3g}")
        assert diff_near > 0, "self-test perturbation had no effect"
        changed = diff_far > 1e-2 * diff_near
        assert changed == expect_change, f"{lt}: sliding window not honoured by the sdpa path"
        del mm


if __name__ == "__main__":
    main()

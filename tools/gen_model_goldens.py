#!/usr/bin/env python3
"""Tiny random-init checkpoints of every supported family + reference logprobs.

Runs on the GPU machine (torch + transformers, no network), from the repo root:

    python3 tools/gen_model_goldens.py

Writes tests/golden/models/<case>/ with
  config.json, model.safetensors (bf16, via save_pretrained), generation_config.json,
  tokenizer.json + tokenizer_config.json (byte-level BPE over 256 byte tokens),
  golden.json: token sequences, per-layer non-unity K/V scales per fp8 format,
               and per variant (fp32, bf16, fp8_e4m3, fp8_e5m2) per sequence the
               reference logprobs[i] = log P(tok_i | tok_<i) (null at 0) and top1_ids
               (ties -> lowest id), from transformers in fp32 eager attention with the
               bf16-rounded weights; variants other than fp32 round K/V at the
               cache-write point (after k_norm and RoPE; V as projected) exactly as
               the fp8kv cache stores them (saturating fp8: clamp, then cast).
  kv.safetensors: the fp32 K/V transformers computed before rounding,
               "seq{s}.layer{l}.k" / ".v" shaped [T, num_kv_heads, head_dim] from the
               fp32 pass, and for layers >= 1 also from each format's own pass
               ("seq{s}.layer{l}.k.fp8_e5m2": deeper layers read the rounded cache
               upstream), so the C++ test can see where a value sits on a rounding
               boundary in every layer.

Everything is deterministic (seeded). Total output is well under 6 MB.
"""
import copy
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from byte_level import bytes_to_unicode

OUT = os.path.join("tests", "golden", "models")
VOCAB = 272          # 256 byte tokens + 16 specials / padding
EOS = 256
BOS = 257
SEQ_LENS = [48, 64]  # longer than the sliding windows (12), several 16-token blocks
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
TORCH_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}

COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=EOS,
              bos_token_id=BOS, initializer_range=0.02, torch_dtype="bfloat16")

# Llama 3's RoPE scaling, scaled down to these models' 32-token original context.
LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32}

# Legacy (transformers 4.x style) config.json contents; transformers 5 reads
# them and save_pretrained rewrites them in its own form (rope_parameters), so
# the committed checkpoints exercise the newer config form.
CASES = {
    "llama": dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=2,
                  rope_theta=10000.0, tie_word_embeddings=False, rope_scaling=LLAMA3_ROPE_SCALING),
    "llama_linear": dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=2,
                         rope_theta=10000.0, tie_word_embeddings=False,
                         rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama_yarn": dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=2,
                       rope_theta=10000.0, tie_word_embeddings=False,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(COMMON, architectures=["MistralForCausalLM"], model_type="mistral", num_hidden_layers=2,
                    rope_theta=10000.0, sliding_window=12, tie_word_embeddings=False),
    "qwen2": dict(COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_hidden_layers=2,
                  rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False, sliding_window=None),
    "qwen3": dict(COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=3,
                  head_dim=32, rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=True,
                  sliding_window=12, max_window_layers=1,
                  layer_types=["full_attention", "sliding_attention", "sliding_attention"]),
    "gemma3": dict(COMMON, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=3,
                   head_dim=16, query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh",
                   sliding_window=12, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                   rope_scaling={"rope_type": "linear", "factor": 8.0}, tie_word_embeddings=True,
                   final_logit_softcapping=None, attn_logit_softcapping=None,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- tokenizer


def tokenizer_json():
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    specials = [{"id": EOS, "content": "<|endoftext|>"}, {"id": BOS, "content": "<|begin|>"}]
    for s in specials:
        vocab[s["content"]] = s["id"]
    added = [dict(id=s["id"], content=s["content"], single_word=False, lstrip=False, rstrip=False,
                  normalized=False, special=True) for s in specials]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin|>": {"id": "<|begin|>", "ids": [BOS], "tokens": ["<|begin|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


# ---------------------------------------------------------------- rounding
def round_kv(x, fmt, scale):
    """x: [B, H, T, D] fp32; scale: [H] fp32 (per head) -> what the cache returns."""
    if fmt == "fp32":
        return x
    if fmt == "bf16":
        return x.to(torch.bfloat16).to(torch.float32)
    s = scale.to(x.device, torch.float32).view(1, -1, 1, 1)
    q = (x / s).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(TORCH_FP8[fmt]).to(torch.float32)
    return q * s


class Hook:
    """Replaces each modeling module's eager_attention_forward: the attention
    call receives K/V after k_norm and RoPE (V as projected), exactly what the
    fp8kv cache stores, before repeat_kv."""

    def __init__(self):
        self.fmt = "fp32"
        self.scales = None   # {"k": [L][H], "v": [L][H]} tensors
        self.record = None   # dict name -> tensor, when recording
        self.seq = 0
        self.originals = {}

    def install(self, modules):
        # One wrapper per module, whichever Hook installed last: a second
        # install replaces the first instead of wrapping it (stacked wrappers
        # would round each later case's K/V again with a stale hook's format).
        for mod in modules:
            orig = getattr(mod, "_fp8kv_eager_attention_forward", None) or getattr(mod, "eager_attention_forward")
            setattr(mod, "_fp8kv_eager_attention_forward", orig)
            self.originals[mod] = orig

            def wrapped(module, query, key, value, *args, _orig=orig, **kwargs):
                layer = module.layer_idx
                if self.record is not None and (self.fmt == "fp32" or layer > 0):
                    # fp32 pass: every layer ("seq0.layer1.k"). A format's pass:
                    # layers >= 1 under a suffix ("seq0.layer1.k.fp8_e5m2"),
                    # since they see that format's rounded cache upstream
                    # (layer 0 is the same in every pass).
                    sfx = "" if self.fmt == "fp32" else "." + self.fmt
                    self.record[f"seq{self.seq}.layer{layer}.k{sfx}"] = key[0].transpose(0, 1).contiguous().float().cpu()
                    self.record[f"seq{self.seq}.layer{layer}.v{sfx}"] = value[0].transpose(0, 1).contiguous().float().cpu()
                if self.fmt != "fp32":
                    ks = self.scales["k"][layer] if self.scales else None
                    vs = self.scales["v"][layer] if self.scales else None
                    key = round_kv(key, self.fmt, ks)
                    value = round_kv(value, self.fmt, vs)
                return _orig(module, query, key, value, *args, **kwargs)

            setattr(mod, "eager_attention_forward", wrapped)


def modeling_module(model):
    # The module that defines the attention class (and eager_attention_forward).
    for m in model.modules():
        if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx"):
            return sys.modules[type(m).__module__]
    raise RuntimeError("no attention module found")


# ---------------------------------------------------------------- model
def init_weights(model, gen):
    std = 0.15  # large: peaked logits, K/V well inside and beyond the fp8 ranges
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                if "gemma" in model.config.model_type:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)         # used as (1 + w)
                else:
                    p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def fp32_model_from_dict(cfg_dict):
    """An fp32 eager-attention model with random init from a config dict."""
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg_dict, f)
    config = AutoConfig.from_pretrained(tmp)
    shutil.rmtree(tmp)
    try:
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    except TypeError:
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)


def make_model(case, cfg_dict, out_dir):
    model = fp32_model_from_dict(cfg_dict)
    config = model.config
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    init_weights(model, gen)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    # The checkpoint is bf16; the reference runs fp32 on the bf16-rounded
    # weights. Round the parameters only: model.to(bfloat16) would also round
    # buffers such as RoPE's inv_freq, which transformers keeps in fp32.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    os.makedirs(out_dir, exist_ok=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    model = model.eval()
    model.config._attn_implementation = "eager"
    # transformers multiplies Gemma embeddings by sqrt(hidden) cast to the
    # weight dtype; the checkpoint dtype is bf16, so round the fp32 run's
    # normalizer to bf16 too (exact here: sqrt(64) = 8).
    emb = model.get_input_embeddings()
    if hasattr(emb, "embed_scale"):
        es = torch.as_tensor(emb.embed_scale, dtype=torch.float32).to(torch.bfloat16).to(torch.float32)
        if isinstance(emb.embed_scale, torch.Tensor):
            emb.embed_scale.copy_(es)
        else:
            emb.embed_scale = float(es)
    return model


def rope_summary(model):
    try:
        re = model.model.rotary_emb
        return getattr(re, "rope_type", None) or str({k: getattr(v, "rope_type", "?") for k, v in re.items()})
    except Exception:  # noqa: BLE001
        pass
    try:
        return str(model.config.rope_parameters)
    except Exception:  # noqa: BLE001
        return "?"


def score(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    logits = out.logits[0].float()
    lsm = torch.log_softmax(logits.double(), dim=-1)
    logprobs = [None] + [float(lsm[i - 1, ids[i]]) for i in range(1, len(ids))]
    # argmax returns the first maximal index (lowest id) on ties.
    top1 = [None] + [int(torch.argmax(logits[i - 1]).item()) for i in range(1, len(ids))]
    return logprobs, top1


def fp8_scales(rec, num_seqs, num_layers, num_kv_heads, kv_layers=None):
    """The fp8 K/V scales the goldens use, per format: K per tensor (0.8 x
    the layer's absmax / fp8 max, repeated per KV head), V per head (1.3 x
    absmax / max), from an fp32 pass's record. Layers outside kv_layers (no
    KV cache) get 1."""
    scales = {}
    for fmt, mx in FP8_MAX.items():
        ks, vs = [], []
        for l in range(num_layers):
            if kv_layers is not None and l not in kv_layers:
                ks.append(torch.ones(num_kv_heads))
                vs.append(torch.ones(num_kv_heads))
                continue
            kam = max(float(rec[f"seq{s}.layer{l}.k"].abs().max()) for s in range(num_seqs))
            vam = torch.stack([rec[f"seq{s}.layer{l}.v"].abs().amax(dim=(0, 2)) for s in range(num_seqs)]).amax(0)
            ks.append(torch.tensor([0.8 * kam / mx], dtype=torch.float32).repeat(num_kv_heads))
            vs.append((1.3 * vam / mx).to(torch.float32))
        scales[fmt] = {"k": ks, "v": vs}
    return scales


def score_fp32_recorded(model, hook, seqs, keep_recording=False):
    """The fp32 pass recording every layer's K/V before rounding (hook: a
    Hook): ({"fp32": [per sequence {logprobs, top1_ids}]}, the record).
    Recording stops after it unless keep_recording (the format passes then
    add their layers >= 1 under a suffix: Hook)."""
    hook.fmt, hook.scales, hook.record = "fp32", None, {}
    variants = {"fp32": []}
    for s, ids in enumerate(seqs):
        hook.seq = s
        lp, top = score(model, ids)
        variants["fp32"].append({"logprobs": lp, "top1_ids": top})
    rec = hook.record
    if not keep_recording:
        hook.record = None
    return variants, rec


def write_tokenizer_files(out_dir):
    """The byte-level test vocabulary's tokenizer.json and tokenizer_config.json,
    and a generation_config.json where save_pretrained wrote none."""
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin|>", "eos_token": "<|endoftext|>", "add_bos_token": False,
                   "model_max_length": 256}, f)
    gc_path = os.path.join(out_dir, "generation_config.json")
    if not os.path.exists(gc_path):
        with open(gc_path, "w") as f:
            json.dump({"bos_token_id": BOS, "eos_token_id": EOS}, f)


def score_cache_variants(model, hook, seqs, scales, variants):
    """Adds variants bf16, fp8_e4m3, fp8_e5m2: every sequence scored with the
    K/V rounded as that cache stores them (hook: a Hook)."""
    for fmt in ["bf16", "fp8_e4m3", "fp8_e5m2"]:
        hook.fmt, hook.scales = fmt, scales.get(fmt)
        variants[fmt] = []
        for s, ids in enumerate(seqs):
            hook.seq = s
            lp, top = score(model, ids)
            variants[fmt].append({"logprobs": lp, "top1_ids": top})
    hook.fmt, hook.scales = "fp32", None


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}")
    hooks_done = set()
    hook = Hook()
    summary = []
    for case, cfg_dict in CASES.items():
        out_dir = os.path.join(OUT, case)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        model = make_model(case, cfg_dict, out_dir)
        mod = modeling_module(model)
        if mod not in hooks_done:
            hook.install([mod])
            hooks_done.add(mod)
        cfg = model.config
        L = cfg.num_hidden_layers
        Hkv = cfg.num_key_value_heads
        gen = torch.Generator().manual_seed(1000 + len(case))
        seqs = [[BOS] + torch.randint(0, 256, (n - 1,), generator=gen).tolist() for n in SEQ_LENS]

        # fp32 pass, recording pre-rounding K/V for the scales and the C++ test.
        variants, rec = score_fp32_recorded(model, hook, seqs, keep_recording=True)

        # Non-unity per-layer scales from the observed ranges: K per tensor
        # (0.8 x amax / max: the top values saturate), V per KV head (1.3 x).
        scales = {}
        for fmt, mx in FP8_MAX.items():
            ks, vs = [], []
            for l in range(L):
                kam = max(float(rec[f"seq{s}.layer{l}.k"].abs().max()) for s in range(len(seqs)))
                vam = torch.stack([rec[f"seq{s}.layer{l}.v"].abs().amax(dim=(0, 2)) for s in range(len(seqs))]).amax(0)
                k = torch.tensor([0.8 * kam / mx], dtype=torch.float32)
                v = (1.3 * vam / mx).to(torch.float32)
                ks.append(k.repeat(Hkv))
                vs.append(v)
            scales[fmt] = {"k": ks, "v": vs}

        for fmt in ["bf16", "fp8_e4m3", "fp8_e5m2"]:
            hook.fmt = fmt
            hook.scales = scales.get(fmt)
            variants[fmt] = []
            for s, ids in enumerate(seqs):
                hook.seq = s
                lp, top = score(model, ids)
                variants[fmt].append({"logprobs": lp, "top1_ids": top})
        hook.fmt, hook.scales, hook.record = "fp32", None, None

        golden = {
            "case": case,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "rope": rope_summary(model),
            "sequences": seqs,
            "scales": {fmt: {"k": [float(t[0]) for t in sc["k"]],
                             "v": [[float(x) for x in t] for t in sc["v"]]} for fmt, sc in scales.items()},
            "variants": variants,
        }
        with open(os.path.join(out_dir, "golden.json"), "w") as f:
            json.dump(golden, f)
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in rec.items()}, os.path.join(out_dir, "kv.safetensors"))
        write_tokenizer_files(out_dir)
        size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
        d = {fmt: max(abs(a - b) for v, w in zip(variants[fmt], variants["fp32"])
                      for a, b in zip(v["logprobs"][1:], w["logprobs"][1:])) for fmt in variants if fmt != "fp32"}
        summary.append((case, rope_summary(model), size, d))

    total = 0
    for root, _, files in os.walk(OUT):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"{'case':14s} {'bytes':>8s}  max|dlogprob| vs fp32 (bf16 / e4m3 / e5m2)  rope")
    for case, rope, size, d in summary:
        print(f"{case:14s} {size:8d}  {d['bf16']:.2e} / {d['fp8_e4m3']:.2e} / {d['fp8_e5m2']:.2e}  {rope}")
    print(f"total {total} bytes under {OUT}")
    if total > 6 * 1024 * 1024:
        print("WARNING: goldens exceed 6 MB", file=sys.stderr)


if __name__ == "__main__":
    main()

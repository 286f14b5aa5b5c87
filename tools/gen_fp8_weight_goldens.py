#!/usr/bin/env python3
"""FP8-weight checkpoints (issue 32) + transformers reference logprobs.

Runs on the GPU machine (torch, safetensors, transformers; CPU math is enough),
from the repo root, in one command:

    python3 tools/gen_fp8_weight_goldens.py
    python3 tools/gen_fp8_weight_goldens.py --add-bf16-compute   # adds
        # transformers' bf16 runs of the saved checkpoints (add_bf16_compute)
    python3 tools/gen_fp8_weight_goldens.py --mini-only   # fp8kv_mini_block alone
    python3 tools/gen_fp8_weight_goldens.py --only NAME   # that one case alone
        # (e.g. qwen3_5_block; any case name below); with --add-bf16-compute,
        # adds the bf16 runs to that saved case alone

Writes tests/golden/fp8_weights/<family>_<format>/ for family in {llama, qwen3}
and format in
  block       quant_method "fp8", weight_block_size [128, 128]: weight F8_E4M3 +
              weight_scale_inv F32 [ceil(N/128), ceil(K/128)]; modules_to_not_convert
  ct_channel  compressed-tensors float-quantized, strategy channel, dynamic
              per-token activations: weight_scale BF16 [N, 1]; ignore (lm_head + a regex)
  ct_tensor   compressed-tensors, strategy tensor, static activations: weight_scale
              F32 [1], input_scale F32 [1]; lm_head quantized too
  modelopt    hf_quant_config.json quant_algo FP8: weight_scale F32 [], input_scale
              F32 []; exclude_modules with a wildcard
each with config.json (+ hf_quant_config.json), model.safetensors (unquantized
tensors in bf16), and golden.json:
  sequences        token ids
  w8a16            reference logprobs (null at 0): transformers, fp32 eager
                   attention, on the weights dequantized in Python as
                   w = float32(q) * scale (one fp32 multiply per element, what the
                   engine does), K/V rounded to bf16 at the cache-write point (the
                   engine's bf16 cache)
  w8a16_fp32_kv    the same with an fp32 cache (band: the bf16 cache's effect)
  w8a16_bf16_weights  the same with the dequantized weights rounded to bf16
                   (the usual "dequantize to bf16" reference), for information
  w8a8             the w8a16 reference with every quantized Linear's input
                   rounded as fp8kv's --fp8-weight-mode w8a8 does (per token, or
                   per 1x128 group for block: scale = amax / 448, x / scale
                   clamped to +-448 then cast to float8_e4m3fn, times scale)
  w8a16_bf16_compute, w8a8_bf16_compute  (--add-bf16-compute) transformers'
                   own bf16 run (weights, activations and K/V in bf16, softmax
                   in fp32) of the checkpoint as saved, dequantized in Python,
                   without and with the W8A8 rounding: the noise a bf16
                   engine adds, and what it does to W8A8's e4m3 activation codes
  max_reduction    the longest dot product (for the fp32 tolerance)
tests/golden/fp8_weights/qwen3_5_block/: a tiny Qwen3.5 hybrid (Gated DeltaNet
layers, linear, linear, full; Qwen3_5ForCausalLM built and initialised as
tools/gen_gdn_goldens.py does, whose functions it imports; it needs
transformers with models/qwen3_5, >= 5.2, and without it the default run
skips the case, saying so) in the block format, every Linear quantized, the
Gated DeltaNet projections (linear_attn.in_proj_qkv / in_proj_z / in_proj_b /
in_proj_a / out_proj) included, except lm_head and
layers.1.linear_attn.in_proj_z (modules_to_not_convert); conv1d, A_log,
dt_bias and the norms bf16. Its
references add, as tools/gen_gdn_goldens.py's do, in_proj_qkv's output (the
conv input) rounded to bf16 (the engine's default conv state), and
  w8a16_tie_flip, w8a8_tie_flip  w8a16 / w8a8 with every conv input within
                   TIE_BITS of a bf16 rounding midpoint rounded to the other
                   neighbour (the band for inputs the engine's f32 sums put
                   on the other side)
max_reduction counts out_proj's value_dim, and the case carries its
w8a16_bf16_compute / w8a8_bf16_compute at once (the CUDA test needs them);
sequences of 48 and 100 tokens (100 > 64: two chunks of the chunked delta
rule). And tests/golden/fp8_weights/fp8kv_mini_block/: models/fp8kv-mini
quantized block-wise (its tokenizer copied), with w8a16 / w8a8 references on
token sequences of the bundled model's own eval text, for CPU-vs-CUDA
perplexity.

Read by tests/engine/test_fp8_weight_goldens.cpp and tests/cuda_ops/test_cuda_goldens.cpp.
Deterministic (seeded).
"""
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_gdn_goldens as gdn  # noqa: E402
from gen_model_goldens import Hook, fp32_model_from_dict, make_model, modeling_module, score, tokenizer_json  # noqa: E402

OUT = os.path.join("tests", "golden", "fp8_weights")
FP8_MAX = 448.0
VOCAB = 272
SEQ_LENS = [40, 56]
# Small enough to track (about 0.45 MB a case): hidden 128 is one 128-wide K
# block; intermediate 200 makes gate/up's second N block and down_proj's second
# K block partial (ceil(200/128) = 2), and k/v_proj (N = 64) a partial block.
COMMON = dict(hidden_size=128, intermediate_size=200, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
              vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=256,
              bos_token_id=257, initializer_range=0.02, torch_dtype="bfloat16", num_hidden_layers=2,
              tie_word_embeddings=False, rope_theta=10000.0)
FAMILIES = {
    "llama": dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama"),
    "qwen3": dict(COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=False),
}
FORMATS = ["block", "ct_channel", "ct_tensor", "modelopt"]
PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj", "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
        "linear_attn.in_proj_a", "linear_attn.out_proj"]
# The block format's excluded projection (beside lm_head).
BLOCK_EXCLUDED = "layers.1.mlp.down_proj"

# The Qwen3.5 case: gen_gdn_goldens' tiny model at hidden 128. Linear layers:
# key_dim 2 x 32 = 64, value_dim 4 x 48 = 192, so in_proj_qkv has N = 320
# (blocks 128, 128, 64), in_proj_z N = 192 and out_proj K = 192 a partial
# second block, in_proj_b / in_proj_a N = 4 (one partial block); the MLPs and
# the full-attention layer as COMMON's. One Gated DeltaNet projection is
# excluded (layer 1's in_proj_z): a linear layer mixing fp8 and bf16
# projections on one input.
QWEN3_5_CASE = "qwen3_5_block"
QWEN3_5 = dict(gdn.COMMON, hidden_size=128, intermediate_size=200, num_attention_heads=2, num_key_value_heads=1,
               head_dim=64, linear_num_key_heads=2, linear_key_head_dim=32, linear_num_value_heads=4,
               linear_value_head_dim=48, num_hidden_layers=3, layer_types=[gdn.LIN, gdn.LIN, gdn.FULL])
QWEN3_5_EXCLUDED = "layers.1.linear_attn.in_proj_z"
QWEN3_5_SEQ_LENS = [48, 100]  # as gen_gdn_goldens: 100 > 64 spans two chunks of the chunked delta rule


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- formats
def quant_config(fmt, block_excluded=BLOCK_EXCLUDED):
    if fmt == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", block_excluded]}
    if fmt in ("ct_channel", "ct_tensor"):
        ch = fmt == "ct_channel"
        acts = ({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True} if ch else
                {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True})
        return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts,
                                              "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                                          "dynamic": False, "strategy": "channel" if ch else "tensor"}}},
                "ignore": ["lm_head", "re:.*layers\\.0\\.self_attn\\.o_proj$"] if ch else []}
    return {"producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                             "exclude_modules": ["lm_head", "model.layers.1.self_attn.*"]}}


def quantized(fmt, module, block_excluded=BLOCK_EXCLUDED):
    """Which modules the format's config quantizes (its own matching rule, spelled out)."""
    if module == "lm_head":
        return fmt == "ct_tensor"
    if fmt == "block":
        return block_excluded not in module
    if fmt == "ct_channel":
        return module != "model.layers.0.self_attn.o_proj"
    if fmt == "modelopt":
        return not module.startswith("model.layers.1.self_attn.")
    return True


def granularity(fmt):
    return {"block": "block", "ct_channel": "channel"}.get(fmt, "tensor")


def quantize(w, gran, scale_dtype=None):
    """w fp32 [N, K] -> (q float8_e4m3fn [N, K], scale fp32 per granularity, deq fp32 [N, K]).
    scale = amax / 448 (1 where amax is 0); q = cast(clamp(w / scale)) (saturating: clamp first)."""
    N, K = w.shape
    if gran == "tensor":
        amax = w.abs().max().reshape(1)
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        full = s.expand(N, K)
    elif gran == "channel":
        amax = w.abs().amax(dim=1)
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        full = s.view(N, 1).expand(N, K)
    else:
        nb, kb = (N + 127) // 128, (K + 127) // 128
        pad = torch.zeros(nb * 128, kb * 128, dtype=torch.float32)
        pad[:N, :K] = w
        amax = pad.abs().view(nb, 128, kb, 128).amax(dim=(1, 3))
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
    if scale_dtype is not None:  # the scale as stored (ct_channel: bf16), so deq = q * stored scale
        s = s.to(scale_dtype).to(torch.float32)
        full = s.view(N, 1).expand(N, K) if gran == "channel" else s.expand(N, K) if gran == "tensor" else \
            s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * full
    return q, s, deq


def scale_tensors(fmt, module, q_scale):
    if fmt == "block":
        return {module + ".weight_scale_inv": q_scale.contiguous()}
    if fmt == "ct_channel":
        return {module + ".weight_scale": q_scale.view(-1, 1).to(torch.bfloat16).contiguous()}
    if fmt == "ct_tensor":
        return {module + ".weight_scale": q_scale.reshape(1).contiguous(),
                module + ".input_scale": torch.tensor([0.05], dtype=torch.float32)}
    return {module + ".weight_scale": q_scale.reshape(()).contiguous(),
            module + ".input_scale": torch.tensor(0.05, dtype=torch.float32)}


# ---------------------------------------------------------------- W8A8 activations
def round_act(x, group):
    """fp8kv's --fp8-weight-mode w8a8 rounding of a Linear input x [..., K]."""
    shp = x.shape
    K = shp[-1]
    g = group if group else K
    xs = x.reshape(-1, K).to(torch.float32)
    out = torch.empty_like(xs)
    for c0 in range(0, K, g):
        blk = xs[:, c0:c0 + g]
        amax = blk.abs().amax(dim=1, keepdim=True)
        s = amax / FP8_MAX
        safe = torch.where(amax > 0, s, torch.ones_like(s))
        q = (blk / safe).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32) * safe
        out[:, c0:c0 + g] = torch.where(amax > 0, q, blk)
    return out.view(shp).to(x.dtype)


class W8A8:
    """Pre-hooks on the quantized Linears: round their inputs as W8A8 does."""

    def __init__(self, model, modules, group):
        self.handles = []
        for name, m in model.named_modules():
            if name in modules:
                self.handles.append(m.register_forward_pre_hook(lambda mod, a: (round_act(a[0], group),)))

    def remove(self):
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------- bf16 compute
def dequantize_saved(sd, fmt, modules):
    """The saved tensors (q + scales, or bf16) -> fp32 weights, as the engine
    dequantizes them: float32(q) * scale of the element's block/row/tensor."""
    out = {}
    for name, t in sd.items():
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        if module in modules:
            q = t.to(torch.float32)
            N, K = q.shape
            if fmt == "block":
                s = sd[module + ".weight_scale_inv"].to(torch.float32)
                full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
            else:
                s = sd[module + ".weight_scale"].to(torch.float32)
                full = s.reshape(N, 1).expand(N, K) if s.numel() == N and N > 1 else s.reshape(()).expand(N, K)
            out[name] = q * full
        elif not name.endswith((".weight_scale_inv", ".weight_scale", ".input_scale")):
            out[name] = t.to(torch.float32)
    return out


def add_bf16_compute(case):
    """Adds "w8a16_bf16_compute" and "w8a8_bf16_compute" to a saved case's
    golden.json, every other key left as it is: the checkpoint dequantized in
    Python, loaded into a bf16 model (from_config in bf16: bf16 weights and
    activations, eager attention with an fp32 softmax), scored on the golden's
    sequences without and with the W8A8 input rounding (round_act, its result
    cast back to bf16). The Qwen3.5 case builds its model as it was made
    (qwen3_5_fp32_model), needs no conv-input hook (in_proj_qkv's output is
    bf16 already, as the bf16 conv state stores it) and runs the delta rule
    in fp32 (transformers' torch paths upcast). Returns the mean
    |w8a8_bf16_compute - w8a8|."""
    from safetensors.torch import load_file
    d = os.path.join(OUT, case)
    g = json.load(open(os.path.join(d, "golden.json")))
    if g.get("family") == "qwen3_5":
        model = qwen3_5_fp32_model()
    else:
        cfg = json.load(open(os.path.join(d, "config.json")))
        cfg.pop("quantization_config", None)
        model = fp32_model_from_dict(cfg)
    model.eval()
    sd = dequantize_saved(load_file(os.path.join(d, "model.safetensors")), g["format"], set(g["quantized_modules"]))
    if "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    # bf16 parameters, buffers (RoPE's inv_freq) left fp32: what
    # from_pretrained(dtype=bfloat16) gives.
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = sd[name].to(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    # No K/V hook: K and V are bf16 already, as the bf16 cache stores them.
    group = 128 if g["format"] == "block" else 0
    g["w8a16_bf16_compute"] = [score(model, s)[0] for s in g["sequences"]]
    w = W8A8(model, set(g["quantized_modules"]), group)
    g["w8a8_bf16_compute"] = [score(model, s)[0] for s in g["sequences"]]
    w.remove()
    g["bf16_compute_versions"] = {"torch": torch.__version__,
                                  "transformers": __import__("transformers").__version__}
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(g, f)
    n = sum(len(s) - 1 for s in g["sequences"])
    return sum(abs(a - b) for x, y in zip(g["w8a8_bf16_compute"], g["w8a8"]) for a, b in zip(x[1:], y[1:])) / n


# ---------------------------------------------------------------- one checkpoint
def with_weights(model, sd):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(sd[name])


def references(model, seqs, hook, quant_modules, group, deq_sd, deq_bf16_sd):
    ref = {"w8a16": [], "w8a16_fp32_kv": [], "w8a16_bf16_weights": [], "w8a8": []}
    with_weights(model, deq_sd)
    for s in seqs:
        hook.fmt = "bf16"
        ref["w8a16"].append(score(model, s)[0])
        hook.fmt = "fp32"
        ref["w8a16_fp32_kv"].append(score(model, s)[0])
        hook.fmt = "bf16"
        w = W8A8(model, quant_modules, group)
        ref["w8a8"].append(score(model, s)[0])
        w.remove()
    with_weights(model, deq_bf16_sd)
    for s in seqs:
        hook.fmt = "bf16"
        ref["w8a16_bf16_weights"].append(score(model, s)[0])
    with_weights(model, deq_sd)
    return ref


def quantize_state(sd, fmt, tied, block_excluded=BLOCK_EXCLUDED):
    """sd: name -> fp32 tensor. Returns (tensors to save, dequantized fp32 sd, quantized module names).
    Quantizes the 2-D weights of PROJ (the Gated DeltaNet projections
    included; conv1d is 3-D) and an untied lm_head, as the format selects."""
    gran = granularity(fmt)
    save, deq, qmods = {}, {}, []
    for name, w in sd.items():
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        is_proj = module is not None and (any(module.endswith(p) for p in PROJ) or (module == "lm_head" and not tied))
        if is_proj and w.dim() == 2 and quantized(fmt, module, block_excluded):
            q, s, d = quantize(w.float(), gran, torch.bfloat16 if fmt == "ct_channel" else None)
            save[name] = q.contiguous()
            save.update(scale_tensors(fmt, module, s))
            deq[name] = d
            qmods.append(module)
        else:
            save[name] = w.to(torch.bfloat16).contiguous()
            deq[name] = w.to(torch.bfloat16).to(torch.float32)
    return save, deq, qmods


def write_checkpoint(out_dir, cfg_dict, fmt, save, block_excluded=BLOCK_EXCLUDED):
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(cfg_dict)
    if fmt != "modelopt":
        cfg["quantization_config"] = quant_config(fmt, block_excluded)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if fmt == "modelopt":
        with open(os.path.join(out_dir, "hf_quant_config.json"), "w") as f:
            json.dump(quant_config(fmt), f, indent=2)
    save_file(save, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def max_reduction(c):
    # Qwen3.5: out_proj reduces over value_dim (Hv x Dv); the delta rule's dots
    # (Dk, the 64-row chunk) are shorter than 128 here.
    value_dim = c.get("linear_num_value_heads", 0) * c.get("linear_value_head_dim", 0)
    return max(c["hidden_size"], c["num_attention_heads"] * c["head_dim"], c["intermediate_size"], c["head_dim"],
               value_dim)


def make_case(family, fmt):
    name = f"{family}_{fmt}"
    out_dir = os.path.join(OUT, name)
    cfg = FAMILIES[family]
    tmp = out_dir + ".tmp_bf16"
    model = make_model(name, cfg, tmp)  # fp32 model on bf16-rounded random weights
    shutil.rmtree(tmp)
    hook = Hook()
    hook.install([modeling_module(model)])
    sd = {k: v.detach().float().clone() for k, v in model.state_dict().items() if k in dict(model.named_parameters())}
    save, deq, qmods = quantize_state(sd, fmt, tied=cfg["tie_word_embeddings"])
    deq_bf16 = {k: v.to(torch.bfloat16).to(torch.float32) for k, v in deq.items()}
    write_checkpoint(out_dir, cfg, fmt, save)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    seqs = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in SEQ_LENS]
    group = 128 if fmt == "block" else 0
    ref = references(model, seqs, hook, set(qmods), group, deq, deq_bf16)
    golden = dict(ref, sequences=seqs, max_reduction=max_reduction(cfg), format=fmt, family=family,
                  quantized_modules=qmods, transformers=__import__("transformers").__version__,
                  torch=torch.__version__)
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    return name, golden


def make_mini():
    """models/fp8kv-mini (Qwen3, bf16) quantized block-wise, with references."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = os.path.join("models", "fp8kv-mini")
    out_dir = os.path.join(OUT, "fp8kv_mini_block")
    try:
        model = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()
    hook = Hook()
    hook.install([modeling_module(model)])
    cfg = json.load(open(os.path.join(src, "config.json")))
    sd = {k: v.detach().float().clone() for k, v in model.named_parameters()}
    save, deq, qmods = quantize_state(sd, "block", tied=cfg.get("tie_word_embeddings", False))
    # Tied embeddings: save the embedding once (lm_head shares it).
    save = {k: v for k, v in save.items() if k != "lm_head.weight"}
    write_checkpoint(out_dir, cfg, "block", save)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), out_dir)
    tok = AutoTokenizer.from_pretrained(src)
    text = ""
    eval_dir = os.path.join(src, "eval")
    for f in sorted(os.listdir(eval_dir)) if os.path.isdir(eval_dir) else []:
        p = os.path.join(eval_dir, f)
        if os.path.isfile(p) and f.endswith(".txt"):
            text += open(p, encoding="utf-8", errors="replace").read()
            if len(text) > 20000:
                break
    ids = tok(text)["input_ids"] if text else torch.randint(0, cfg["vocab_size"], (1024,)).tolist()
    seqs = [ids[i:i + 256] for i in range(0, min(len(ids), 4 * 256), 256) if len(ids[i:i + 256]) == 256]
    deq_bf16 = {k: v.to(torch.bfloat16).to(torch.float32) for k, v in deq.items()}
    ref = references(model, seqs, hook, set(qmods), 128, deq, deq_bf16)
    golden = dict(ref, sequences=seqs, max_reduction=max_reduction(
        dict(cfg, head_dim=cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]))),
        format="block", family="qwen3", quantized_modules=qmods)
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f)
    return "fp8kv_mini_block", golden


def have_qwen3_5():
    return gdn.have("qwen3_5") and hasattr(transformers, "Qwen3_5ForCausalLM")


def qwen3_5_fp32_model():
    """The Qwen3.5 case's Qwen3_5ForCausalLM, fp32, eager attention (as
    gen_gdn_goldens.run_case builds it), random-initialised."""
    return gdn.fp32_model("qwen3_5", QWEN3_5)


def make_qwen3_5_case():
    """qwen3_5_block: gen_gdn_goldens' weights (init_weights: bf16-rounded),
    quantized block-wise, references on the dequantized weights with
    gen_gdn_goldens.Qwen35Hook (K/V of the full-attention layer rounded at
    the cache write through gen_model_goldens.Hook, in_proj_qkv's output
    rounded to bf16), plus the tie-flip passes and the bf16-compute runs."""
    if not have_qwen3_5():
        raise RuntimeError(f"{QWEN3_5_CASE} needs transformers with models/qwen3_5 (>= 5.2); this is "
                           f"transformers {transformers.__version__}")
    name = QWEN3_5_CASE
    out_dir = os.path.join(OUT, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    model = qwen3_5_fp32_model()
    gdn.init_weights(model, torch.Generator().manual_seed(sum(map(ord, name))))
    hook = gdn.Qwen35Hook(model, "qwen3_5")
    params = dict(model.named_parameters())
    # The Qwen3.5 names fp8kv loads (the model's own with models/qwen3_5);
    # bf16 -> fp32 is exact on the rounded weights.
    sd = {k: v.float() for k, v in gdn.qwen3_5_state_dict("qwen3_5", model, QWEN3_5).items() if k in params}
    assert set(sd) == set(params), sorted(set(params) ^ set(sd))
    save, deq, qmods = quantize_state(sd, "block", tied=QWEN3_5["tie_word_embeddings"],
                                      block_excluded=QWEN3_5_EXCLUDED)
    for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):  # layer 0's, every one
        assert f"model.layers.0.linear_attn.{p}" in qmods, p
    assert "model.layers.1.linear_attn.in_proj_z" not in qmods and "lm_head" not in qmods
    deq_bf16 = {k: v.to(torch.bfloat16).to(torch.float32) for k, v in deq.items()}
    write_checkpoint(out_dir, gdn.config_json(QWEN3_5), "block", save, block_excluded=QWEN3_5_EXCLUDED)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    seqs = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in QWEN3_5_SEQ_LENS]
    kv = hook.kv
    ref = references(model, seqs, kv, set(qmods), 128, deq, deq_bf16)  # leaves the deq weights in
    # The band for conv inputs at a bf16 rounding tie: bf16 cache, every
    # near-tie conv input rounded the other way (the test adds the gap).
    hook.flip, kv.fmt = True, "bf16"
    ref["w8a16_tie_flip"] = [score(model, s)[0] for s in seqs]
    w = W8A8(model, set(qmods), 128)
    ref["w8a8_tie_flip"] = [score(model, s)[0] for s in seqs]
    w.remove()
    # Unrounded from here: the wrapped eager_attention_forward stays
    # installed in the modeling module, and the bf16 run below must see its
    # own bf16 K/V as they are.
    hook.flip, kv.fmt = False, "fp32"
    golden = dict(ref, sequences=seqs, max_reduction=max_reduction(QWEN3_5), format="block", family="qwen3_5",
                  quantized_modules=qmods, reference_model=type(model).__name__, tie_bits=gdn.TIE_BITS,
                  transformers=transformers.__version__, torch=torch.__version__)
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    torch.use_deterministic_algorithms(deterministic)
    log(f"{name:22s} mean |w8a8 bf16 compute - w8a8| {add_bf16_compute(name):.5f}")
    size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
    log(f"{name:22s} {size} bytes")
    with open(os.path.join(out_dir, "golden.json")) as f:
        return name, json.load(f)


def case_names():
    return [f"{family}_{fmt}" for family in FAMILIES for fmt in FORMATS] + [QWEN3_5_CASE, "fp8kv_mini_block"]


def make_named(name):
    if name == QWEN3_5_CASE:
        return make_qwen3_5_case()
    if name == "fp8kv_mini_block":
        return make_mini()
    family, fmt = name.split("_", 1)
    return make_case(family, fmt)


def only_arg():
    """--only NAME (or --only=NAME): the one case to make; None without."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a.startswith("--only="):
            name = a[len("--only="):]
        elif a == "--only":
            name = argv[i + 1] if i + 1 < len(argv) else ""
        else:
            continue
        if name not in case_names():
            sys.exit(f"--only: unknown case '{name}'; cases: {', '.join(case_names())}")
        return name
    return None


def summary(name, g):
    def gap(a, b):
        return max(abs(x - y) for sa, sb in zip(g[a], g[b]) for x, y in zip(sa[1:], sb[1:]))

    def mean_lp(a):
        v = [x for s in g[a] for x in s[1:]]
        return sum(v) / len(v)
    log(f"{name:22s} mean lp {mean_lp('w8a16'):8.4f}  max|w8a8-w8a16| {gap('w8a8', 'w8a16'):.4f}  "
        f"max|bf16 weights - w8a16| {gap('w8a16_bf16_weights', 'w8a16'):.4f}  "
        f"max|fp32 kv - bf16 kv| {gap('w8a16_fp32_kv', 'w8a16'):.5f}  ppl {math.exp(-mean_lp('w8a16')):.3f}")
    if "w8a16_tie_flip" in g:
        log(f"{name:22s} max|tie flip - ref| w8a16 {gap('w8a16_tie_flip', 'w8a16'):.5f}  "
            f"w8a8 {gap('w8a8_tie_flip', 'w8a8'):.5f}")


def main():
    only = only_arg()
    if "--add-bf16-compute" in sys.argv[1:]:
        for case in [only] if only else sorted(os.listdir(OUT)):
            if case == QWEN3_5_CASE and not have_qwen3_5():
                log(f"{case:22s} skipped: transformers {transformers.__version__} has no models/qwen3_5 (>= 5.2)")
                if only:
                    sys.exit(1)
            elif os.path.exists(os.path.join(OUT, case, "golden.json")):
                log(f"{case:22s} mean |w8a8 bf16 compute - w8a8| {add_bf16_compute(case):.5f}")
            elif only:
                sys.exit(f"{os.path.join(OUT, case)}: no golden.json; make it first (--only {case})")
        return
    if "--mini-only" in sys.argv[1:]:
        summary(*make_mini())
        return
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    if only:
        summary(*make_named(only))
        return
    for family in FAMILIES:
        for fmt in FORMATS:
            summary(*make_case(family, fmt))
    if have_qwen3_5():
        summary(*make_qwen3_5_case())
    else:
        log(f"{QWEN3_5_CASE}: skipped: transformers {transformers.__version__} has no models/qwen3_5 (>= 5.2); "
            f"run `python3 tools/gen_fp8_weight_goldens.py --only {QWEN3_5_CASE}` where it has")
    if "--no-mini" not in sys.argv:
        summary(*make_mini())


if __name__ == "__main__":
    main()

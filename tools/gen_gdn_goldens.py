#!/usr/bin/env python3
"""Tiny random Qwen3.5 (Gated DeltaNet + gated full attention) checkpoints
and transformers references for the CPU engine (issue 33).

Runs on the GPU machine (torch + transformers, no network), from the repo root:

    python3 tools/gen_gdn_goldens.py
    python3 tools/gen_gdn_goldens.py --add-bf16-compute   # adds transformers'
        # bf16 run of the saved checkpoints to golden.json (add_bf16_compute)

Needs transformers with models/qwen3_5 (Qwen3_5ForCausalLM, transformers
>= 5.2); with an older transformers that has models/qwen3_next (>= 4.57) it
runs the same layers through Qwen3NextForCausalLM (dense MLPs, its fused
in_proj_qkvz / in_proj_ba split into the Qwen3.5 tensors when saved) and says
so in golden.json ("reference_model"). The reference always runs in fp32 on
the CPU, so transformers takes its torch paths (torch_chunk_gated_delta_rule
for prefill, torch_recurrent_gated_delta_rule for cached decode), never the
FLA / hub kernels.

Writes tests/golden/models_qwen3_5/<case>/: config.json (qwen3_5_text),
model.safetensors (bf16), tokenizer files, golden.json:
- "sequences" and "variants" {fp32, bf16, fp8_e4m3, fp8_e5m2}: per-position
  logprobs and top-1 of teacher-forced prefill (fp32 on the bf16-rounded
  weights; K/V of the full-attention layers rounded at the cache-write point
  as each cache dtype stores them; "fp32" keeps K/V unrounded);
- "scales": the fp8 K/V scales those variants used (per layer; layers
  without a KV cache get 1);
- "decode": a prompt, then greedy steps with transformers' cache (the
  recurrent decode path): the chosen ids and their logprobs, fp32 cache;
- "states": max |.| of each linear layer's recurrent and conv state after
  the first sequence (a scale for future state comparisons).
Every variant rounds in_proj_qkv's output (the conv input) to bf16: the
engine's default conv state is bf16 and holds exactly those values
(docs/design.md "Qwen3.5 hybrids"). "bf16_tie_flip" (bf16 cache) rounds
the conv inputs within TIE_BITS of a bf16 midpoint to the other neighbour:
the test's band for inputs the engine's f32 sum puts on the other side.

Cases cover 1, 2 and 3 linear layers per full layer and attention head_dim
64 and 256. Deterministic (seeded); fails when a case exceeds 1 MB.
"""
import json
import os
import shutil
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model_goldens as base  # noqa: E402

OUT = os.path.join("tests", "golden", "models_qwen3_5")
SEQ_LENS = [48, 100]      # 100 > 64: two chunks of the chunked prefill
DECODE_PROMPT, DECODE_STEPS = 70, 8
CASE_LIMIT = 1024 * 1024

COMMON = dict(vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=base.EOS,
              bos_token_id=base.BOS, tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
              linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=32,
              linear_num_key_heads=2, linear_num_value_heads=4, torch_dtype="bfloat16")
LIN, FULL = "linear_attention", "full_attention"
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
CASES = {
    # 3 linear : 1 full (the real models' pattern), head_dim 64.
    "l3f1_hd64": dict(COMMON, head_dim=64, num_hidden_layers=4, layer_types=[LIN, LIN, LIN, FULL]),
    # 2 : 1, grouped value heads (1 key head serves 4 value heads).
    "l2f1_hd64": dict(COMMON, head_dim=64, num_hidden_layers=3, layer_types=[LIN, LIN, FULL],
                      linear_num_key_heads=1),
    # 1 : 1, head_dim 256 (the real models' attention head size); 2 query heads
    # on 1 KV head keep the case under CASE_LIMIT (4 on 2 made 1.47 MB).
    "l1f1_hd256": dict(COMMON, head_dim=256, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=4,
                       layer_types=[LIN, FULL, LIN, FULL]),
}

log = base.log


def have(module):
    try:
        __import__("transformers.models." + module)
        return True
    except ImportError:
        return False


def reference_kind():
    if have("qwen3_5") and hasattr(transformers, "Qwen3_5ForCausalLM"):
        return "qwen3_5"
    if have("qwen3_next") and hasattr(transformers, "Qwen3NextForCausalLM"):
        log("transformers has no models/qwen3_5 (needs >= 5.2): falling back to models/qwen3_next "
            "(Qwen3NextForCausalLM, dense MLPs; weights converted to the Qwen3.5 layout)")
        return "qwen3_next"
    sys.exit(f"transformers {transformers.__version__} has neither models/qwen3_5 (>= 5.2) nor models/qwen3_next "
             "(>= 4.57): upgrade transformers")


def make_config(kind, cfg):
    c = {k: v for k, v in cfg.items() if k != "torch_dtype"}
    if kind == "qwen3_5":
        c.update(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", rope_parameters=dict(ROPE))
        return transformers.Qwen3_5TextConfig(**{k: v for k, v in c.items() if k not in ("architectures", "model_type")})
    L = c["num_hidden_layers"]
    c.update(num_experts=0, mlp_only_layers=list(range(L)), rope_theta=ROPE["rope_theta"],
             partial_rotary_factor=ROPE["partial_rotary_factor"], decoder_sparse_step=1)
    return transformers.Qwen3NextConfig(**{k: v for k, v in c.items() if k not in ("architectures", "model_type")})


def init_weights(model, gen):
    """Projections N(0, 0.15) (peaked logits), the conv N(0, 0.5), A = exp(A_log)
    in [1, 16) and dt_bias 1 (transformers' init), zero-centred norms
    (1 + w) near 1, the gated norm (a plain weight) near 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "linear_attn.norm" in name:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
            elif "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)  # used as 1 + w
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.15)
        for p in model.parameters():  # the checkpoint is bf16: the reference runs on the rounded values
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def qwen3_5_state_dict(kind, model, cfg):
    """The model's tensors under Qwen3.5 names (bf16)."""
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if kind == "qwen3_5":
        return sd
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv, r = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], Hv // Hk
    out = {}
    for k, v in sd.items():
        if k.endswith("linear_attn.in_proj_qkvz.weight"):
            # Qwen3Next: rows grouped per key head [q Dk | k Dk | v r*Dv | z r*Dv].
            g = v.view(Hk, 2 * Dk + 2 * r * Dv, -1)
            q, kk, vv, z = torch.split(g, [Dk, Dk, r * Dv, r * Dv], dim=1)
            pre = k[: -len("in_proj_qkvz.weight")]
            out[pre + "in_proj_qkv.weight"] = torch.cat([x.reshape(-1, g.shape[-1]) for x in (q, kk, vv)]).contiguous()
            out[pre + "in_proj_z.weight"] = z.reshape(-1, g.shape[-1]).contiguous()
        elif k.endswith("linear_attn.in_proj_ba.weight"):
            g = v.view(Hk, 2 * r, -1)
            b, a = torch.split(g, [r, r], dim=1)
            pre = k[: -len("in_proj_ba.weight")]
            out[pre + "in_proj_b.weight"] = b.reshape(-1, g.shape[-1]).contiguous()
            out[pre + "in_proj_a.weight"] = a.reshape(-1, g.shape[-1]).contiguous()
        else:
            out[k] = v
    return out


def config_json(cfg):
    c = {k: v for k, v in cfg.items() if k != "torch_dtype"}
    c.update(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", dtype="bfloat16",
             rope_parameters=dict(ROPE), attn_output_gate=True)
    return c


# A conv input whose f32 bits lie within TIE_BITS (of the 2^16 below a bf16)
# of a rounding midpoint may round the other way in the engine: its f32
# projection sums in another order (a few f32 ulps apart). 64 covers 2^6 ulps.
TIE_BITS = 64


def round_conv_input(o, flip):
    """o rounded to bf16 (RNE), returned as fp32; with flip, the elements near a
    midpoint take the other bf16 neighbour."""
    r = o.to(torch.bfloat16).to(torch.float32)
    if not flip:
        return r
    bits = o.contiguous().view(torch.int32)
    low = bits & 0xFFFF
    near = (low - 0x8000).abs() <= TIE_BITS
    down = (bits & ~0xFFFF).view(torch.float32)             # toward zero
    up = ((bits & ~0xFFFF) + 0x10000).view(torch.float32)   # away from zero
    other = torch.where(r == down, up, down)
    return torch.where(near & torch.isfinite(o), other, r)


class Qwen35Hook:
    """The K/V cache rounding of base.Hook (eager_attention_forward of the
    modeling module), plus in_proj_qkv's output rounded to bf16 (the conv
    state dtype): a forward hook on each linear layer's projection."""

    def __init__(self, model, kind):
        # "flip": conv inputs within TIE_BITS of a bf16 rounding midpoint round
        # to the other neighbour (the "bf16_tie_flip" band's pass).
        self.flip = False
        self.kv = base.Hook()
        self.kv.install([base.modeling_module(model)])
        for layer in model.model.layers:
            la = getattr(layer, "linear_attn", None)
            if la is None:
                continue
            proj = la.in_proj_qkv if kind == "qwen3_5" else la.in_proj_qkvz
            if kind == "qwen3_5":
                proj.register_forward_hook(lambda m, i, o: round_conv_input(o, self.flip))
            else:  # q, k, v rows of the fused projection (z is not a conv input: leave it)
                Hk, Dk = la.num_k_heads, la.head_k_dim
                r, Dv = la.num_v_heads // la.num_k_heads, la.head_v_dim

                def round_qkv(m, i, o, Hk=Hk, Dk=Dk, r=r, Dv=Dv):
                    g = o.view(*o.shape[:-1], Hk, 2 * Dk + 2 * r * Dv).clone()
                    n = 2 * Dk + r * Dv
                    g[..., :n] = round_conv_input(g[..., :n], self.flip)
                    return g.view(o.shape)

                proj.register_forward_hook(round_qkv)


def greedy_decode(model, prompt, steps):
    """Prefill the prompt with a cache, then `steps` one-token steps (the
    recurrent path), greedy; fp32 cache."""
    ids, lps = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].double()
        for _ in range(steps):
            lsm = torch.log_softmax(logits, dim=-1)
            nxt = int(torch.argmax(logits).item())
            ids.append(nxt)
            lps.append(float(lsm[nxt]))
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].double()
    return ids, lps


def state_scales(model, ids):
    """max |state| per linear layer after a cached prefill of ids."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    cache = out.past_key_values
    res = {}
    for i, layer in enumerate(model.model.layers):
        if getattr(layer, "linear_attn", None) is None:
            continue
        try:
            lay = cache.layers[i]
            rec, conv = lay.recurrent_states[0], lay.conv_states[0]
        except (AttributeError, IndexError, TypeError):
            rec, conv = cache.recurrent_states[i], cache.conv_states[i]
        res[str(i)] = {"recurrent_max_abs": float(rec.abs().max()), "conv_max_abs": float(conv.abs().max())}
    return res


def fp32_model(kind, cfg):
    """The case's model class on cfg, fp32, eager attention, default-initialised."""
    config = make_config(kind, cfg)
    cls = transformers.Qwen3_5ForCausalLM if kind == "qwen3_5" else transformers.Qwen3NextForCausalLM
    try:
        model = cls._from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    except TypeError:
        model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    model = model.to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    return model


def run_case(kind, case, cfg):
    torch.use_deterministic_algorithms(True)
    out_dir = os.path.join(OUT, case)
    os.makedirs(out_dir, exist_ok=True)
    model = fp32_model(kind, cfg)
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    init_weights(model, gen)
    from safetensors.torch import save_file
    save_file(qwen3_5_state_dict(kind, model, cfg), os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json(cfg), f, indent=1)

    hook = Qwen35Hook(model, kind)
    L = cfg["num_hidden_layers"]
    full = [i for i, t in enumerate(cfg["layer_types"]) if t == FULL]
    gen = torch.Generator().manual_seed(3000 + len(case))
    seqs = [[base.BOS] + torch.randint(0, 256, (n - 1,), generator=gen).tolist() for n in SEQ_LENS]

    kv = hook.kv
    variants, rec = base.score_fp32_recorded(model, kv, seqs)
    scales = base.fp8_scales(rec, len(seqs), L, cfg["num_key_value_heads"], kv_layers=full)
    base.score_cache_variants(model, kv, seqs, scales, variants)
    # The band for conv inputs at a rounding tie: bf16 cache, every near-tie
    # conv input rounded the other way (the test adds |this - bf16|).
    hook.flip, kv.fmt, kv.scales = True, "bf16", None
    variants["bf16_tie_flip"] = []
    for s, ids in enumerate(seqs):
        kv.seq = s
        lp, top = base.score(model, ids)
        variants["bf16_tie_flip"].append({"logprobs": lp, "top1_ids": top})
    hook.flip, kv.fmt = False, "fp32"

    prompt = [base.BOS] + torch.randint(0, 256, (DECODE_PROMPT - 1,), generator=gen).tolist()
    dec_ids, dec_lps = greedy_decode(model, prompt, DECODE_STEPS)

    golden = {
        "case": case, "torch": torch.__version__, "transformers": transformers.__version__,
        "reference_model": cls.__name__, "sequences": seqs,
        "scales": {fmt: {"k": [float(t[0]) for t in sc["k"]], "v": [[float(x) for x in t] for t in sc["v"]]}
                   for fmt, sc in scales.items()},
        "variants": variants,
        "decode": {"prompt": prompt, "ids": dec_ids, "logprobs": dec_lps},
        "states": state_scales(model, seqs[0]),
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(base.tokenizer_json(), f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin|>", "eos_token": "<|endoftext|>", "add_bos_token": False,
                   "model_max_length": 256}, f)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": base.BOS, "eos_token_id": base.EOS}, f)
    size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
    if size > CASE_LIMIT:
        raise RuntimeError(f"{case}: {size} bytes > {CASE_LIMIT}")
    gaps = {fmt: max(abs(a - b) for v, w in zip(variants[fmt], variants["fp32"])
                     for a, b in zip(v["logprobs"][1:], w["logprobs"][1:])) for fmt in variants if fmt != "fp32"}
    return case, size, gaps, dec_ids


def add_bf16_compute(case):
    """Adds transformers' own bf16 run of a case's saved checkpoint to its
    golden.json, leaving every other key as it is: "variants"."bf16_compute"
    (teacher-forced logprobs and top-1) and "decode_bf16_compute" (greedy
    ids, logprobs). from_pretrained in bf16: bf16 weights and activations,
    softmax in fp32 (eager attention), the delta rule in fp32 (the torch
    paths upcast q, k, v, g, beta), no hook (K/V stay bf16, as a bf16 cache
    stores them). It measures the error that bf16 arithmetic alone opens on
    the model: the line for the CUDA engine, whose GEMM inputs are bf16."""
    d = os.path.join(OUT, case)
    with open(os.path.join(d, "golden.json")) as f:
        g = json.load(f)
    try:
        model = transformers.Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager")
    except TypeError:
        model = transformers.Qwen3_5ForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16,
                                                                attn_implementation="eager")
    model = model.eval()
    v = []
    for ids in g["sequences"]:
        lp, top = base.score(model, ids)
        v.append({"logprobs": lp, "top1_ids": top})
    g["variants"]["bf16_compute"] = v
    ids, lps = greedy_decode(model, g["decode"]["prompt"], len(g["decode"]["ids"]))
    g["decode_bf16_compute"] = {"ids": ids, "logprobs": lps}
    g["bf16_compute_versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(g, f)
    gap = sum(abs(a - b) for x, y in zip(v, g["variants"]["fp32"]) for a, b in zip(x["logprobs"][1:], y["logprobs"][1:]))
    n = sum(len(x["logprobs"]) - 1 for x in v)
    return gap / n, ids, g["decode"]["ids"]


def main():
    if "--add-bf16-compute" in sys.argv[1:]:
        if reference_kind() != "qwen3_5":
            sys.exit("--add-bf16-compute needs transformers' models/qwen3_5 (>= 5.2)")
        for case in CASES:
            gap, ids, ids32 = add_bf16_compute(case)
            log(f"{case}: bf16_compute mean |dlogprob| vs fp32 {gap:.5f}; greedy bf16 {ids}, fp32 {ids32}")
        return
    torch.manual_seed(0)
    log(f"torch {torch.__version__}, transformers {transformers.__version__} (qwen3_5 needs transformers >= 5.2)")
    kind = reference_kind()
    log(f"reference model: {kind}")
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    failures = []
    for case, cfg in CASES.items():
        try:
            case, size, gaps, dec = run_case(kind, case, cfg)
            log(f"{case}: {size} bytes, max |dlogprob| vs fp32 per cache dtype {gaps}, greedy {dec}")
            if kind == "qwen3_5":
                gap, ids, _ = add_bf16_compute(case)
                log(f"{case}: bf16_compute mean |dlogprob| vs fp32 {gap:.5f}, greedy {ids}")
        except Exception as e:  # noqa: BLE001  (report every case, fail at the end)
            import traceback
            traceback.print_exc()
            failures.append(f"{case}: {e}")
    if failures:
        sys.exit("failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()

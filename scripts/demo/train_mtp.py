#!/usr/bin/env python3
"""Trains a small GLM-4.5-architecture model WITH its multi-token-prediction (MTP) layer on
the demo corpus, on the GPU machine (torch, transformers 5.17, tokenizers; no network), for
kiln's MTP drafter (issue 43):

    scripts/demo/train_mtp.py CORPUS_DIR OUT_DIR [--minutes 5] [--smoke]

CORPUS_DIR: train.jsonl.gz and heldout.jsonl.gz, as scripts/demo/train_demo.py reads them
(records, render and pack are imported from it). The tokenizer is the demo model's, as is
(models/kiln-demo/tokenizer.json + tokenizer_config.json, copied to OUT_DIR).

1. A Glm4MoeForCausalLM of about 5.8 M parameters (d_model 256, 4 layers of 8 heads of 32 with
   2 KV heads, partial rotary 0.5, q/k/v bias, no qk norm (as GLM-4.5-Air), layer 0 dense
   (d_ff 512), layers 1-3 MoE: 8 routed experts top-2 of d_ff 128, sigmoid routing with
   e_score_correction_bias, 1 group, routed_scaling_factor 2.5, 1 shared expert), plus one MTP
   layer (about 1.2 M) stored as model.layers.4, as GLM-4.5 checkpoints store it.
2. The MTP layer as vLLM computes it at inference (vllm/model_executor/models/glm4_moe_mtp.py,
   deepseek_mtp.py): at position t, with h_t the main model's final hidden state after the
   final norm and x_{t+1} the next token,
       e = embed_tokens(x_{t+1}), zero where the position is 0 (vLLM: inputs_embeds[positions == 0] = 0)
       u = eh_proj([enorm(e) | hnorm(h_t)])                       eh_proj: [d_model, 2 d_model], no bias
       o = decoder_layer(u)   (a Glm4MoeDecoderLayer, MoE, its own keys/values, positions t, causal;
                               the layer returns residual + ..., as vLLM's residual + hidden_states)
       logits = lm_head(shared_head.norm(o))   predicting x_{t+2}; lm_head and embed_tokens are the
                                               main model's (shared, not saved twice).
   Loss = CE(main) + 0.3 CE(MTP) over positions t = 0 .. T-3 of each window, joint (nothing
   detached, as DeepSeek-V3 trains its MTP module).
3. Training as train_demo.py: packed 512-token windows, attention_mask None (causal sdpa),
   AdamW, warm-up then cosine by elapsed time, bf16 autocast, gradient clipping. transformers'
   Glm4Moe router has no auxiliary loss (DeepseekV3TopkRouter: Glm4MoeConfig has no
   router_aux_loss_coef / output_router_logits); experts are balanced instead by DeepSeek-V3's
   auxiliary-loss-free rule: after each step every router's e_score_correction_bias moves by
   --bias-update (1e-3) towards under-loaded experts, so the saved biases are non-zero.
4. OUT_DIR: config.json (Glm4MoeConfig, num_nextn_predict_layers 1), generation_config.json and
   the tokenizer files (the demo model's), model.safetensors in bf16 (experts per expert as
   GLM-4.5 checkpoints: mlp.experts.E.{gate,up,down}_proj.weight; the MTP layer as
   model.layers.4.{enorm,hnorm,eh_proj,shared_head.norm} + a decoder layer's names),
   golden.safetensors + golden.json (fp32 logits of the saved bf16 weights: main logits [T, V]
   and MTP logits [T-1, V] for two prompts; greedy continuations), train_log.json (loss
   curves, held-out bits per byte, MTP acceptance).
   The checkpoint is reloaded with transformers (main model) and with this script's own
   loader (MTP layer) and compared before the goldens are taken.

--smoke: about 20 steps on a slice of the corpus, every output written, well under a minute.
If anything after training fails, the trained state is kept as OUT_DIR/train_state.pt and
--from-state OUT_DIR/train_state.pt redoes the rest without training again.
"""
import argparse
import copy
import glob
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer, Glm4MoeRMSNorm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_demo import SAMPLE_PROMPTS, SEQ, VOCAB, pack, records, render  # noqa: E402

N_LAYERS = 4          # main decoder layers; the MTP layer is model.layers.{N_LAYERS}
MTP_WEIGHT = 0.3      # loss = CE(main) + MTP_WEIGHT * CE(MTP)
N_GEN = 12            # greedy continuation length in golden.json, as the demo's
SHORT_TOKENS, LONG_TOKENS = 30, 80


def model_config(tok, n_nextn):
    """Glm4MoeConfig keys as transformers 5.17 names them. Relied on: the @strict Glm4MoeConfig
    of huggingface/transformers src/transformers/models/glm4_moe/modular_glm4_moe.py (fields
    n_routed_experts, n_shared_experts, moe_intermediate_size, routed_scaling_factor, n_group,
    topk_group, first_k_dense_replace, norm_topk_prob, use_qk_norm, num_nextn_predict_layers,
    rope_parameters; partial_rotary_factor through rope_parameters) and this repo's
    tests/data/models/glm4_moe_d128/config.json, written by transformers 5.17 from the same
    keywords (scripts/fixtures/make_fixtures.py)."""
    return Glm4MoeConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=N_LAYERS,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, attention_bias=True, use_qk_norm=False,
        partial_rotary_factor=0.5,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
        first_k_dense_replace=1, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        num_nextn_predict_layers=n_nextn,
        # pad_token_id None: no padding_idx, so <|endoftext|> (the packing separator) gets a
        # trained embedding row; generation_config.json still names it as the pad token.
        bos_token_id=None, eos_token_id=[tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        pad_token_id=None)


class MtpLayer(torch.nn.Module):
    """model.layers.{L} of a GLM-4.5 checkpoint. Submodule names are the checkpoint's names
    under that prefix, except `block.`, whose tensors sit directly under it (vLLM's loader
    adds `mtp_block.` for them)."""

    def __init__(self, main_config):
        super().__init__()
        d = main_config.hidden_size
        eps = main_config.rms_norm_eps
        self.enorm = Glm4MoeRMSNorm(d, eps=eps)
        self.hnorm = Glm4MoeRMSNorm(d, eps=eps)
        self.eh_proj = torch.nn.Linear(2 * d, d, bias=False)  # [d_model, 2 d_model]
        # The decoder layer with layer_idx = num_hidden_layers: a copy of the model's config
        # (its attention and experts implementations included) that counts one more layer,
        # so a layer kind chosen by index (first_k_dense_replace or mlp_layer_types) is MoE.
        cfg = copy.deepcopy(main_config)
        cfg.num_hidden_layers = main_config.num_hidden_layers + 1
        if isinstance(getattr(cfg, "mlp_layer_types", None), list):
            cfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
        self.block = Glm4MoeDecoderLayer(cfg, main_config.num_hidden_layers)
        assert hasattr(self.block.mlp, "gate") and hasattr(self.block.mlp, "experts"), "MTP layer is not MoE"
        self.shared_head = torch.nn.ModuleDict({"norm": Glm4MoeRMSNorm(d, eps=eps)})
        self.attn_implementation = cfg._attn_implementation
        # Not a PreTrainedModel: initialised here as transformers initialises Glm4Moe
        # (normal(0, initializer_range) matrices, unit norms, zero biases and correction bias).
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, main_config.initializer_range)
            for name, b in self.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.zero_()


def attention_mask(allowed, impl, dtype):
    """allowed: [n_q, n_k] bool, True where a query sees a key -> the decoder layer's mask:
    bool for sdpa, additive for eager (as transformers' masking_utils makes them)."""
    if impl == "sdpa":
        return allowed[None, None]
    assert impl == "eager", f"no mask for attention implementation {impl}"
    m = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return m.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def causal_mask(n, impl, dtype, device):
    if impl == "sdpa":
        return None  # sdpa's is_causal, as the model's own layers get it; check_causal() tests it
    return attention_mask(torch.ones(n, n, dtype=torch.bool, device=device).tril(), impl, dtype)


def mtp_input(model, mtp, h, next_ids, pos):
    """u = eh_proj([enorm(e) | hnorm(h)]). h: [B, N, d_model], next_ids: [B, N], pos: [1, N]."""
    e = model.model.embed_tokens(next_ids)
    e = e.masked_fill((pos == 0).unsqueeze(-1), 0.0)  # vLLM: inputs_embeds[positions == 0] = 0
    return mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.hnorm(h)], dim=-1))


def mtp_block(model, mtp, u, pos, mask):
    """o = the MTP decoder layer on u at positions pos ([1, N]), rotary from the model's rotary_emb."""
    pe = model.model.rotary_emb(u, position_ids=pos)
    o = mtp.block(u, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    return o[0] if isinstance(o, tuple) else o


def mtp_head(model, mtp, o):
    return model.lm_head(mtp.shared_head["norm"](o))


def forward_both(model, mtp, x):
    """x: [B, T] -> main logits [B, T, V] and MTP logits [B, T-1, V] (position t fed x_{t+1},
    predicting x_{t+2}), plus h [B, T, d_model] and the MTP output o [B, T-1, d_model]."""
    h = model.model(input_ids=x, use_cache=False).last_hidden_state
    logits = model.lm_head(h)
    n = x.shape[1] - 1
    pos = torch.arange(n, device=x.device)[None]
    u = mtp_input(model, mtp, h[:, :n], x[:, 1:], pos)
    o = mtp_block(model, mtp, u, pos, causal_mask(n, mtp.attn_implementation, u.dtype, u.device))
    return logits, mtp_head(model, mtp, o), h, o, u


class RouterLoad:
    """Counts the experts each MoE layer picks (a forward pre-hook on its `experts` module, which
    receives the top-k expert ids as its one integer input, whether the router or the MoE
    block computes them) and applies DeepSeek-V3's auxiliary-loss-free balancing to the
    router's e_score_correction_bias: bias_e += speed * sign(mean load - load_e)."""

    def __init__(self, named_modules):
        self.moes = [(n, m) for n, m in named_modules
                     if hasattr(m, "gate") and hasattr(m, "experts") and hasattr(m.gate, "e_score_correction_bias")]
        self.counts = {}
        self.missing = set()
        for name, m in self.moes:
            m.experts.register_forward_pre_hook(self._hook(name, m.gate.e_score_correction_bias.numel()),
                                                with_kwargs=True)

    def _hook(self, name, n_experts):
        def hook(_module, args, kwargs):
            ids = [t for t in list(args) + list(kwargs.values()) if torch.is_tensor(t) and not t.is_floating_point()]
            if len(ids) == 1:
                c = torch.bincount(ids[0].reshape(-1), minlength=n_experts)
                self.counts[name] = self.counts.get(name, 0) + c
        return hook

    @torch.no_grad()
    def update(self, speed):
        for name, m in self.moes:
            c = self.counts.get(name)
            if c is None:
                if name not in self.missing:
                    self.missing.add(name)
                    print(f"WARNING: no expert ids seen for {name}: its correction bias is not updated", flush=True)
            elif speed > 0:
                load = c.float()
                m.gate.e_score_correction_bias.add_(speed * torch.sign(load.mean() - load))
        self.counts = {}

    def fractions(self):
        out = {}
        for name, _ in self.moes:
            c = self.counts.get(name)
            if c is not None:
                out[name] = [round(float(v), 4) for v in (c.float() / c.sum()).tolist()]
        self.counts = {}
        return out


@torch.no_grad()
def check_causal(model, mtp, x):
    """Main and MTP outputs at a position depend on no later token, and the MTP output at
    position 0 not on x_1 (its embedding is zeroed). x: [1, T]. fp32, no autocast."""
    la, ma, _, _, _ = forward_both(model, mtp, x)
    y = x.clone()
    y[0, -1] = (y[0, -1] + 1) % VOCAB
    lb, mb, _, _, _ = forward_both(model, mtp, y)
    assert torch.allclose(la[:, :-1], lb[:, :-1], atol=1e-4), "main model: a later token changed an earlier position"
    assert torch.allclose(ma[:, :-1], mb[:, :-1], atol=1e-4), "MTP layer: a later token changed an earlier position"
    assert not torch.allclose(ma[:, -1], mb[:, -1], atol=1e-4), "MTP layer: its last position ignores its input token"
    y = x.clone()
    y[0, 1] = (y[0, 1] + 1) % VOCAB
    _, mc, _, _, _ = forward_both(model, mtp, y)
    assert torch.allclose(ma[:, 0], mc[:, 0], atol=1e-4), "MTP layer: position 0 depends on x_1 (embedding not zeroed)"


def chain_mask(n, impl, dtype, device):
    """[2n, 2n]: n first-pass queries (causal among themselves), then n second-pass queries;
    second-pass query j (position j+1) sees first-pass keys 0..j and itself, as a drafter's
    KV cache would hold them after one chained step."""
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    top = torch.cat([causal, torch.zeros(n, n, dtype=torch.bool, device=device)], 1)
    bottom = torch.cat([causal, torch.eye(n, dtype=torch.bool, device=device)], 1)
    return attention_mask(torch.cat([top, bottom], 0), impl, dtype)


@torch.no_grad()
def evaluate(model, mtp, ids, n_bytes, device, max_windows=None, batch=16):
    """Held-out: bits per byte of the main model (train_demo.bits_per_byte's definition),
    MTP loss, and greedy acceptance of one MTP draft and (estimate) of a chained second one."""
    model.eval()
    mtp.eval()
    dev_type = "cuda" if device == "cuda" else "cpu"
    n = (len(ids) - 1) // SEQ
    if max_windows:
        n = min(n, max_windows)
    s = dict(main_nats=0.0, mtp_nats=0.0, main_tokens=0, mtp_tokens=0, d1_ok=0, d1_n=0, d1_true=0,
             d1_first=0, both=0, both_n=0, chain_first_pass_max_diff=0.0)
    for b in range(0, n, batch):
        rows = [ids[i * SEQ:(i + 1) * SEQ + 1] for i in range(b, min(n, b + batch))]
        x = torch.tensor(np.stack(rows), device=device)  # [B, SEQ + 1]
        with torch.autocast(dev_type, dtype=torch.bfloat16):
            logits, l1, h, o1, u1 = forward_both(model, mtp, x[:, :-1])  # [B, SEQ, V], [B, N, V], N = SEQ - 1
            nn_ = SEQ - 1
            d1 = l1.argmax(-1)                                            # draft of x_{t+2}, t = 0 .. N-1
            # Chained second draft: o1 as h, d1 as the token, positions t + 1.
            pos1 = torch.arange(nn_, device=device)[None]
            u2 = mtp_input(model, mtp, o1, d1, pos1 + 1)
            both_u = torch.cat([u1, u2], 1)
            both_pos = torch.cat([pos1, pos1 + 1], 1)
            o = mtp_block(model, mtp, both_u, both_pos, chain_mask(nn_, mtp.attn_implementation, u2.dtype, device))
            l2 = mtp_head(model, mtp, o[:, nn_:])
        s["chain_first_pass_max_diff"] = max(s["chain_first_pass_max_diff"], float((o[:, :nn_] - o1).abs().max()))
        logits, l1, l2 = logits.float(), l1.float(), l2.float()
        s["main_nats"] += float(F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1), reduction="sum"))
        s["mtp_nats"] += float(F.cross_entropy(l1.reshape(-1, VOCAB), x[:, 2:].reshape(-1), reduction="sum"))
        s["main_tokens"] += x[:, 1:].numel()
        s["mtp_tokens"] += x[:, 2:].numel()
        main_next = logits.argmax(-1)               # [B, SEQ]: the main model's token after x_0..x_t
        ok1 = d1 == main_next[:, 1:]                # [B, N]: draft of x_{t+2} == main's greedy at t+1
        d2 = l2.argmax(-1)[:, :nn_ - 1]             # [B, N-1]: draft of x_{t+3}, t = 0 .. N-2
        ok2 = d2 == main_next[:, 2:]                # [B, N-1]: == main's greedy at t+2 (true prefix)
        first = ok1[:, :nn_ - 1]
        s["d1_ok"] += int(ok1.sum())
        s["d1_n"] += ok1.numel()
        s["d1_true"] += int((d1 == x[:, 2:]).sum())
        s["d1_first"] += int(first.sum())
        s["both"] += int((first & ok2).sum())
        s["both_n"] += first.numel()
    model.train()
    mtp.train()
    covered = n * SEQ / (len(ids) - 1)  # the windows cover n * SEQ predicted tokens
    a1 = s["d1_ok"] / s["d1_n"]
    p_both = s["both"] / s["both_n"]
    return {
        "heldout_bits_per_byte": s["main_nats"] / math.log(2) / (n_bytes * covered),
        "heldout_windows": n,
        "main_nats_per_token": s["main_nats"] / s["main_tokens"],
        "mtp_nats_per_token": s["mtp_nats"] / s["mtp_tokens"],
        "mtp_top1_vs_true_token": s["d1_true"] / s["d1_n"],
        "acceptance_draft1": a1,
        "acceptance_draft2_given_draft1_estimate": s["both"] / max(1, s["d1_first"]),
        "tokens_per_verify_step_1_draft": 1 + a1,
        "tokens_per_verify_step_2_drafts_estimate": 1 + a1 + p_both,
        "positions": s["d1_n"],
        "chain_first_pass_max_diff": s["chain_first_pass_max_diff"],
    }


def split_experts(name, v, cfg):
    """One state_dict entry -> checkpoint entries: a fused expert tensor (transformers 5:
    mlp.experts.gate_up_proj [E, 2 d_ff, d_model], gate rows then up rows, and
    mlp.experts.down_proj [E, d_model, d_ff]; the qwen2_moe conversion that glm4_moe shares in
    src/transformers/conversion_mapping.py merges gate_proj / up_proj per expert into it) ->
    mlp.experts.E.{gate,up,down}_proj.weight, as GLM-4.5 checkpoints store them."""
    n_exp, d_ff, d = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    if name.endswith(".mlp.experts.gate_up_proj"):
        assert tuple(v.shape) == (n_exp, 2 * d_ff, d), f"{name}: {tuple(v.shape)}"
        base = name[:-len("gate_up_proj")]
        return {**{f"{base}{e}.gate_proj.weight": v[e, :d_ff] for e in range(n_exp)},
                **{f"{base}{e}.up_proj.weight": v[e, d_ff:] for e in range(n_exp)}}
    if name.endswith(".mlp.experts.down_proj"):
        assert tuple(v.shape) == (n_exp, d, d_ff), f"{name}: {tuple(v.shape)}"
        base = name[:-len("down_proj")]
        return {f"{base}{e}.down_proj.weight": v[e] for e in range(n_exp)}
    return {name: v}


def to_checkpoint(sd, cfg, rename=lambda k: k):
    """A state_dict -> {checkpoint name: bf16 CPU tensor of its own storage}."""
    out = {}
    for k, v in sd.items():
        for name, t in split_experts(rename(k), v, cfg).items():
            assert name not in out, name
            out[name] = t.detach().to("cpu", torch.bfloat16).contiguous().clone()
    n_exp, d_ff, d = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    for name, t in out.items():
        if ".mlp.experts." in name:
            want = (d, d_ff) if name.endswith("down_proj.weight") else (d_ff, d)
            assert tuple(t.shape) == want, f"{name}: {tuple(t.shape)}, want {want}"
    return out


def from_checkpoint(ckpt, template, cfg, rename):
    """Inverse of to_checkpoint for one module: template is its state_dict (names and
    layouts); returns (state_dict in fp32, checkpoint names used)."""
    out, used = {}, set()
    for k, ref in template.items():
        name = rename(k)
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name[:-len("gate_up_proj")]
            parts = [[f"{base}{e}.gate_proj.weight", f"{base}{e}.up_proj.weight"] for e in range(ref.shape[0])]
            out[k] = torch.stack([torch.cat([ckpt[g], ckpt[u]], 0) for g, u in parts])
            used.update(n for p in parts for n in p)
        elif name.endswith(".mlp.experts.down_proj"):
            base = name[:-len("down_proj")]
            names = [f"{base}{e}.down_proj.weight" for e in range(ref.shape[0])]
            out[k] = torch.stack([ckpt[n] for n in names])
            used.update(names)
        else:
            out[k] = ckpt[name]
            used.add(name)
        assert out[k].shape == ref.shape, f"{k}: {tuple(out[k].shape)} vs {tuple(ref.shape)}"
        out[k] = out[k].float()
    return out, used


@torch.no_grad()
def round_to_bf16_(module):
    """Parameters and routing correction biases to bf16-representable values, in place (the
    unsaved rotary inv_freq stays exact), so the in-memory model is the saved checkpoint."""
    ts = list(module.parameters()) + [b for n, b in module.named_buffers() if n.endswith("e_score_correction_bias")]
    for t in ts:
        t.copy_(t.to(torch.bfloat16).float())


def train(a, model, mtp, routers, train_ids, device):
    dev_type = "cuda" if device == "cuda" else "cpu"
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget = a.minutes * 60
    max_steps = 20 if a.smoke else None
    log_every = 5 if a.smoke else 50
    t0 = time.time()
    curve, step = [], 0
    data = torch.tensor(train_ids, device=device)
    window = torch.arange(SEQ + 1, device=device)
    while True:
        elapsed = time.time() - t0
        if elapsed > budget or (max_steps is not None and step >= max_steps):
            break
        progress = min(1.0, elapsed / budget)
        lr = a.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - SEQ - 1, (a.batch, 1), device=device)
        x = data[starts + window]  # [B, SEQ + 1]
        with torch.autocast(dev_type, dtype=torch.bfloat16):
            logits, mtp_logits, _, _, _ = forward_both(model, mtp, x[:, :-1])
            lm = F.cross_entropy(logits.float().reshape(-1, VOCAB), x[:, 1:].reshape(-1))
            lm_mtp = F.cross_entropy(mtp_logits.float().reshape(-1, VOCAB), x[:, 2:].reshape(-1))
            loss = lm + MTP_WEIGHT * lm_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        routers.update(a.bias_update)
        if step % log_every == 0:
            lv, mv = float(lm), float(lm_mtp)
            assert math.isfinite(lv) and math.isfinite(mv), f"step {step}: loss {lv} / {mv}"
            curve.append({"step": step, "seconds": round(elapsed, 1), "loss": round(lv, 4),
                          "mtp_loss": round(mv, 4), "lr": lr})
            print(f"step {step} {elapsed:.0f}s loss {lv:.3f} mtp {mv:.3f}", flush=True)
        step += 1
    return curve, step, time.time() - t0


def greedy(ref, ids, n=N_GEN):
    """Full recompute each step (no cache), as the demo's golden."""
    ids, out, margin = list(ids), [], math.inf
    with torch.no_grad():
        for _ in range(n):
            last = ref(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            top2 = torch.topk(last, 2).values
            margin = min(margin, float(top2[0] - top2[1]))
            out.append(int(torch.argmax(last)))
            ids.append(out[-1])
    return out, margin


def golden_prompts(tok, held_records):
    """A held-out chat rendered as the template renders it (first 30 tokens) and a held-out
    document (first 80 tokens): the distribution the MTP layer was trained on."""
    chat = next(r for r in held_records if "messages" in r)
    doc = next(r for r in held_records if "text" in r
               and len(tok.encode(r["text"], add_special_tokens=False).ids) >= LONG_TOKENS)
    short = tok.encode(render(chat), add_special_tokens=False).ids[:SHORT_TOKENS]
    long_ = tok.encode(doc["text"], add_special_tokens=False).ids[:LONG_TOKENS]
    assert len(short) >= 16 and len(long_) == LONG_TOKENS, (len(short), len(long_))
    return short, long_


def write_checkpoint(a, model, mtp, cfg, tok_dir, log):
    """model.safetensors (main + MTP, bf16, per-expert names), config.json,
    generation_config.json, tokenizer files."""
    L = cfg.num_hidden_layers
    tmp = tempfile.mkdtemp(dir=a.out, prefix=".save_pretrained-")
    try:
        # transformers' own save, for config.json and to compare its tensor names with ours.
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp)
        tf_saved = {}
        for f in glob.glob(os.path.join(tmp, "*.safetensors")):
            tf_saved.update(load_file(f))
        config = json.load(open(os.path.join(tmp, "config.json")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    main = to_checkpoint(model.state_dict(), cfg)
    mtp_t = to_checkpoint(mtp.state_dict(), cfg, lambda k: f"model.layers.{L}." + (k[6:] if k.startswith("block.") else k))
    assert not set(main) & set(mtp_t)
    assert all(k.startswith(f"model.layers.{L}.") for k in mtp_t)
    for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "mlp.gate.weight",
              "mlp.gate.e_score_correction_bias", "self_attn.q_proj.bias", "mlp.experts.0.gate_proj.weight",
              "mlp.shared_experts.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"):
        assert f"model.layers.{L}.{k}" in mtp_t, f"MTP tensor model.layers.{L}.{k} missing"
    assert tuple(mtp_t[f"model.layers.{L}.eh_proj.weight"].shape) == (cfg.hidden_size, 2 * cfg.hidden_size)
    same = set(tf_saved) == set(main) and all(torch.equal(tf_saved[k].float(), main[k].float()) for k in main)
    log["save_pretrained_matches_names"] = same
    print(f"main tensors: {len(main)}, MTP tensors: {len(mtp_t)}; transformers' save_pretrained writes the same "
          f"names and values: {same}", flush=True)
    if not same:
        diff = sorted(set(tf_saved) ^ set(main))
        log["save_pretrained_name_diff"] = diff[:20]
        print(f"  names only one side has (first 20): {diff[:20]}", flush=True)
    save_file({**main, **mtp_t}, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})

    config.update({"architectures": ["Glm4MoeForCausalLM"], "num_nextn_predict_layers": 1, "dtype": "bfloat16"})
    json.dump(config, open(os.path.join(a.out, "config.json"), "w"), indent=2, sort_keys=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(tok_dir, f), os.path.join(a.out, f))
    return main, mtp_t


def reload_and_goldens(a, model, mtp, cfg, tok, held_records, device, log):
    """Reloads the written checkpoint (transformers for the main model, from_checkpoint for the
    MTP layer), compares it with the trained model, writes golden.safetensors / golden.json."""
    L = cfg.num_hidden_layers
    ref_cfg = Glm4MoeConfig.from_pretrained(a.out)
    assert ref_cfg.num_nextn_predict_layers == 1
    ref_cfg.num_nextn_predict_layers = 0  # the main model only, whether or not transformers builds MTP layers
    ref, info = Glm4MoeForCausalLM.from_pretrained(a.out, config=ref_cfg, dtype=torch.float32,
                                                   attn_implementation="eager", output_loading_info=True)
    ref.eval()
    assert not info.get("missing_keys"), f"missing on reload: {sorted(info['missing_keys'])[:10]}"
    assert not info.get("mismatched_keys"), f"mismatched on reload: {list(info['mismatched_keys'])[:10]}"
    unexpected = sorted(info.get("unexpected_keys") or [])
    assert all(k.startswith(f"model.layers.{L}.") for k in unexpected), f"unexpected on reload: {unexpected[:10]}"
    trained = model.state_dict()
    ref_sd = ref.state_dict()
    assert set(ref_sd) == set(trained), sorted(set(ref_sd) ^ set(trained))[:10]
    for k, v in trained.items():
        assert torch.equal(ref_sd[k].float(), v.float().cpu()), f"{k} differs after the round trip"
    print(f"reload: transformers loads every main tensor back unchanged ({len(unexpected)} MTP tensors left to us)",
          flush=True)

    ckpt = load_file(os.path.join(a.out, "model.safetensors"))
    mtp_ref = MtpLayer(ref.config).eval()
    assert mtp_ref.attn_implementation == "eager"
    sd, used = from_checkpoint(ckpt, mtp_ref.state_dict(), cfg,
                               lambda k: f"model.layers.{L}." + (k[6:] if k.startswith("block.") else k))
    mtp_ref.load_state_dict(sd, strict=True)
    left = sorted(k for k in ckpt if k.startswith(f"model.layers.{L}.") and k not in used)
    assert not left, f"MTP tensors not loaded: {left}"
    for k, v in mtp.state_dict().items():
        assert torch.equal(mtp_ref.state_dict()[k], v.float().cpu()), f"MTP {k} differs after the round trip"

    short, long_ = golden_prompts(tok, held_records)
    gold, margins = {}, {}
    with torch.no_grad():
        for name, ids in (("short", short), ("long", long_)):
            x = torch.tensor([ids])
            check_causal(ref, mtp_ref, x)
            logits, mtp_logits, _, _, _ = forward_both(ref, mtp_ref, x)
            gold[f"logits_{name}"] = logits[0].float().contiguous()          # [T, V]
            gold[f"mtp_logits_{name}"] = mtp_logits[0].float().contiguous()  # [T-1, V]
            top2 = torch.topk(mtp_logits[0].float(), 2, dim=-1).values
            margins[name] = float((top2[:, 0] - top2[:, 1]).min())
            # The trained model (fp32, sdpa, on the device) against the reloaded reference.
            tl, tm, _, _, _ = forward_both(model.eval(), mtp.eval(), x.to(device))
            for what, got, want in (("main", tl, logits), ("MTP", tm, mtp_logits)):
                err = float((got.float().cpu() - want).abs().max() / want.abs().max())
                log.setdefault("reload_max_rel_err", {})[f"{what}_{name}"] = err
                # The exact check is the state-dict equality above; this one bounds device vs CPU
                # arithmetic (a routing near-tie could flip one expert, hence the loose bound).
                assert err < 1e-2, f"{what} logits of the reloaded checkpoint differ from the trained model: {err}"
    model.train()
    mtp.train()
    assert gold["logits_short"].shape == (len(short), VOCAB) and gold["mtp_logits_short"].shape == (len(short) - 1, VOCAB)
    g_short, m1 = greedy(ref, short)
    g_long, m2 = greedy(ref, long_)
    save_file(gold, os.path.join(a.out, "golden.safetensors"))
    json.dump({"architecture": "Glm4MoeForCausalLM", "dtype": "bfloat16", "transformers": transformers.__version__,
               "torch": torch.__version__, "prompt_short": short, "prompt_long": long_, "greedy_short": g_short,
               "greedy_long": g_long, "min_top2_margin": min(m1, m2), "mtp_layer": L,
               "mtp_logits": "row t: the MTP layer at position t fed h_t (the main model's final normed hidden "
                             "state) and the prompt's token t+1 (embedding zero at position 0), predicting "
                             "token t+2; rows 0 .. T-2",
               "mtp_min_top2_margin": min(margins.values())},
              open(os.path.join(a.out, "golden.json"), "w"), indent=1)
    print(f"goldens: {len(short)} + {len(long_)} tokens, min top-2 margin main {min(m1, m2):.4f} "
          f"MTP {min(margins.values()):.4f}", flush=True)
    return ref


def samples(ref, tok, cfg, n, max_new):
    out = []
    for i, prompt in enumerate(SAMPLE_PROMPTS[:n]):
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])
        torch.manual_seed(100 + i)
        g = ref.generate(ids, max_new_tokens=max_new, do_sample=True, temperature=0.7, top_p=0.9,
                         eos_token_id=cfg.eos_token_id, pad_token_id=tok.token_to_id("<|endoftext|>"))
        out.append({"prompt": prompt, "reply": tok.decode(g[0, ids.shape[1]:].tolist(), skip_special_tokens=True)})
    return out


def main():
    global N_LAYERS
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--bias-update", type=float, default=1e-3,
                    help="DeepSeek-V3 aux-loss-free balancing speed for e_score_correction_bias (0: off)")
    ap.add_argument("--smoke", action="store_true", help="about 20 steps on a slice of the corpus; all outputs")
    ap.add_argument("--from-state", help="a train_state.pt of an earlier run: skip training")
    ap.add_argument("--layers", type=int, default=N_LAYERS,
                    help="main decoder layers (the MTP layer follows them); the committed model has 4, where "
                         "the MTP layer is a fifth of the depth (GLM-4.5-Air: one of 47)")
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "models", "kiln-demo"))
    a = ap.parse_args()
    N_LAYERS = a.layers
    if a.smoke:
        a.batch = min(a.batch, 8)
    t_start = time.time()
    torch.manual_seed(0)
    random.seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(a.out, exist_ok=True)

    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    eot = tok.token_to_id("<|endoftext|>")
    train_records = list(records(os.path.join(a.corpus, "train.jsonl.gz")))
    held_records = list(records(os.path.join(a.corpus, "heldout.jsonl.gz")))
    if a.smoke:
        train_records = train_records[:3000]
    train_texts = [render(r) for r in train_records]
    held_texts = [render(r) for r in held_records]
    train_ids, held_ids = pack(tok, train_texts, eot), pack(tok, held_texts, eot)
    held_bytes = sum(len(t.encode("utf-8")) for t in held_texts)
    t_tok = time.time() - t_start
    print(f"packing: {t_tok:.1f} s, {len(train_ids)} train tokens, {len(held_ids)} held-out tokens", flush=True)

    cfg = model_config(tok, 0)  # num_nextn_predict_layers 0 in memory: the MTP layer is ours
    model = Glm4MoeForCausalLM._from_config(cfg, attn_implementation="sdpa").to(device)
    cfg = model.config
    layers = model.model.layers
    assert len(layers) == N_LAYERS, len(layers)
    assert not hasattr(layers[0].mlp, "experts") and all(hasattr(l.mlp, "experts") for l in layers[1:]), \
        "want layer 0 dense, layers 1.. MoE"
    mtp = MtpLayer(cfg).to(device)
    assert mtp.attn_implementation == "sdpa", mtp.attn_implementation
    routers = RouterLoad(list(model.named_modules()) + [("mtp." + n, m) for n, m in mtp.named_modules()])
    assert len(routers.moes) == (N_LAYERS - 1) + 1, [n for n, _ in routers.moes]  # MoE layers 1..3 + the MTP layer
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    aux = hasattr(cfg, "router_aux_loss_coef") or hasattr(cfg, "output_router_logits")
    print(f"model: {n_main / 1e6:.2f} M parameters + MTP layer {n_mtp / 1e6:.2f} M; router aux loss in the "
          f"config: {aux}", flush=True)
    x0 = torch.tensor(train_ids[None, :64], device=device)
    check_causal(model, mtp, x0)
    routers.counts = {}

    log = {"parameters_main": n_main, "parameters_mtp": n_mtp, "batch": a.batch, "seq": SEQ,
           "mtp_loss_weight": MTP_WEIGHT, "smoke": a.smoke,
           "router_aux_loss": (f"none: transformers {transformers.__version__} Glm4Moe's router has no auxiliary "
                               f"loss (config attribute present: {aux}); balancing by the aux-loss-free "
                               f"e_score_correction_bias update, speed {a.bias_update}")}
    if a.from_state:
        st = torch.load(a.from_state, map_location=device)
        model.load_state_dict(st["model"])
        mtp.load_state_dict(st["mtp"])
        curve, steps, train_seconds = st["curve"], st["steps"], st["train_seconds"]
        print(f"state of {steps} steps loaded from {a.from_state}", flush=True)
    else:
        curve, steps, train_seconds = train(a, model, mtp, routers, train_ids, device)
        print(f"trained {steps} steps in {train_seconds:.0f} s", flush=True)
    state_path = os.path.join(a.out, "train_state.pt")
    torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "curve": curve, "steps": steps,
                "train_seconds": train_seconds}, state_path)

    round_to_bf16_(model)
    round_to_bf16_(mtp)
    biases = {n: [round(float(v), 4) for v in m.gate.e_score_correction_bias.tolist()] for n, m in routers.moes}
    if routers.missing:
        log["bias_update_missing"] = sorted(routers.missing)
    failed = None
    try:
        write_checkpoint(a, model, mtp, cfg, a.tokenizer, log)
        ev = evaluate(model, mtp, held_ids, held_bytes, device, max_windows=4 if a.smoke else None)
        log["expert_load_heldout"] = routers.fractions()
        print(json.dumps(ev, indent=1), flush=True)
        log.update(ev)
        ref = reload_and_goldens(a, model, mtp, cfg, tok, held_records, device, log)
        log["samples"] = samples(ref, tok, cfg, 1 if a.smoke else len(SAMPLE_PROMPTS), 24 if a.smoke else 80)
    except Exception as e:  # noqa: BLE001 - report, keep the trained state, exit non-zero
        traceback.print_exc()
        failed = repr(e)
        log["error"] = failed
    log.update({"steps": steps, "train_seconds": round(train_seconds, 1), "packing_seconds": round(t_tok, 1),
                "total_seconds": round(time.time() - t_start, 1), "train_tokens": int(len(train_ids)),
                "heldout_tokens": int(len(held_ids)), "heldout_bytes": held_bytes,
                "e_score_correction_bias": biases,
                "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
                "transformers": transformers.__version__, "loss_curve": curve})
    json.dump(log, open(os.path.join(a.out, "train_log.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in log.items() if k not in ("loss_curve", "e_score_correction_bias",
                                                                 "expert_load_heldout")}, indent=1), flush=True)
    if failed:
        print(f"FAILED after training: {failed}; the trained state is in {state_path} "
              f"(rerun with --from-state {state_path})", flush=True)
        sys.exit(1)
    os.remove(state_path)
    print(f"ok: {a.out}", flush=True)


if __name__ == "__main__":
    main()

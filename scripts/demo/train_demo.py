#!/usr/bin/env python3
"""Trains kiln's built-in demo model on the GPU machine (torch, transformers, tokenizers;
no network), within a time budget:

    scripts/demo/train_demo.py CORPUS_DIR OUT_DIR [--minutes 5]

CORPUS_DIR: train.jsonl.gz, heldout.jsonl.gz (scripts/demo/make_corpus.sh) and
chat_template.jinja (kiln's demo ChatML template: the "chat_template" of the tokenizer_config.json
`kiln demo-model --tokenizer-only 320 --out DIR` writes, as is).

1. A byte-level BPE tokenizer of 4,096 ids trained with the Rust `tokenizers` library on
   the training split (the Qwen2 split regex, as kiln's generated demo tokenizer), with
   the ChatML tokens: <|endoftext|>, <|im_start|>, <|im_end|> special; <think>, </think>,
   <tool_call>, </tool_call>, <tool_response>, </tool_response> added, not special (Qwen3's
   flags).
2. A GptOssForCausalLM of about 7.5 M parameters (d_model 256, 4 layers of 8 heads of 32
   with 2 KV heads, attention sinks, sliding window 128 on every other layer, 8 experts
   top-2 with d_ff 192, YaRN x4 over 512 positions, so 2,048 positions) trained from
   scratch: documents and chats (rendered as the chat template renders them, each ending
   in <|endoftext|>) packed into 512-token windows, AdamW, warm-up then cosine by elapsed
   time, bf16 autocast, the router's load-balancing loss.
3. Bits per byte on the held-out split: the summed next-token loss in bits over its UTF-8
   bytes (documents packed the same way, 512-token windows, no overlap).
4. OUT_DIR: the checkpoint as kiln loads it (config.json, generation_config.json,
   model.safetensors in bf16, tokenizer.json, tokenizer_config.json with the chat
   template), golden.safetensors + golden.json for kiln's family test (fp32 logits of the
   saved bf16 weights, greedy continuations), and train_log.json (loss curve, bits per
   byte, timing, sample replies).
"""
import argparse
import gzip
import json
import math
import os
import random
import time

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GptOssConfig, GptOssForCausalLM

VOCAB = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
SEQ = 512
SAMPLE_PROMPTS = ["Tell me a short story.", "What does \"ocean\" mean?", "What is the json module for?",
                  "Tell me a joke.", "Say something wise."]


def records(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def render(r):
    """A record as training text: a document, or a chat as the template renders it."""
    if "text" in r:
        return r["text"]
    out = ""
    for m in r["messages"]:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(ADDED), special_tokens=SPECIAL, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def pack(tok, texts, eot):
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.array(ids, dtype=np.int64)


def model_config(tok):
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    return GptOssConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        head_dim=32, intermediate_size=192, num_local_experts=8, num_experts_per_tok=2, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=2048,
        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=SEQ),
        tie_word_embeddings=False, router_aux_loss_coef=0.02, output_router_logits=True,
        bos_token_id=None, eos_token_id=eos, pad_token_id=tok.token_to_id("<|endoftext|>"))


@torch.no_grad()
def bits_per_byte(model, ids, n_bytes, device):
    model.eval()
    total = 0.0
    n = (len(ids) - 1) // SEQ
    for b in range(0, n, 32):
        rows = [ids[i * SEQ:(i + 1) * SEQ + 1] for i in range(b, min(n, b + 32))]
        x = torch.tensor(np.stack(rows), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1], use_cache=False).logits.float()
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                                                         reduction="sum"))
    model.train()
    # The windows cover n * SEQ predicted tokens: scale the held-out bytes to that share.
    covered = n * SEQ / (len(ids) - 1)
    return total / math.log(2) / (n_bytes * covered)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(0)
    random.seed(0)
    device = "cuda"
    os.makedirs(a.out, exist_ok=True)

    train_texts = [render(r) for r in records(os.path.join(a.corpus, "train.jsonl.gz"))]
    held_texts = [render(r) for r in records(os.path.join(a.corpus, "heldout.jsonl.gz"))]
    tok = train_tokenizer(train_texts)
    eot = tok.token_to_id("<|endoftext|>")
    train_ids, held_ids = pack(tok, train_texts, eot), pack(tok, held_texts, eot)
    held_bytes = sum(len(t.encode("utf-8")) for t in held_texts)
    t_tok = time.time() - t_start
    print(f"tokenizer + packing: {t_tok:.1f} s, {len(train_ids)} train tokens, {len(held_ids)} held-out tokens, "
          f"{sum(len(t.encode()) for t in train_texts) / len(train_ids):.2f} bytes/token", flush=True)

    cfg = model_config(tok)
    model = GptOssForCausalLM(cfg).to(device)
    model.config._attn_implementation = "eager"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget = a.minutes * 60
    t0 = time.time()
    curve, step = [], 0
    data = torch.tensor(train_ids, device=device)
    window = torch.arange(SEQ + 1, device=device)
    while True:
        elapsed = time.time() - t0
        if elapsed > budget:
            break
        progress = elapsed / budget
        lr = a.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - SEQ - 1, (a.batch, 1), device=device)
        x = data[starts + window]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x[:, :-1], use_cache=False, output_router_logits=True)
            lm = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, VOCAB), x[:, 1:].reshape(-1))
            loss = lm + cfg.router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            curve.append({"step": step, "seconds": round(elapsed, 1), "loss": round(float(lm), 4), "lr": lr})
            print(f"step {step} {elapsed:.0f}s loss {float(lm):.3f}", flush=True)
        step += 1
    train_seconds = time.time() - t0
    print(f"trained {step} steps in {train_seconds:.0f} s", flush=True)

    # The checkpoint, in bf16, as kiln loads it.
    model.config.output_router_logits = False
    model.to(torch.bfloat16).save_pretrained(a.out)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    template = open(os.path.join(a.corpus, "chat_template.jinja")).read()
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": t in SPECIAL} for t in SPECIAL + ADDED}
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 2048,
               "added_tokens_decoder": added, "chat_template": template},
              open(os.path.join(a.out, "tokenizer_config.json"), "w"), indent=2, ensure_ascii=False)
    gen_cfg = {"eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id, "do_sample": True,
               "temperature": 0.7, "top_p": 0.9, "transformers_version": transformers.__version__}
    json.dump(gen_cfg, open(os.path.join(a.out, "generation_config.json"), "w"), indent=2)

    # Bits per byte of the saved bf16 weights; goldens and samples. After the checkpoint is
    # written: a failure here keeps it.
    samples, bpb = [], float("nan")
    try:
        bpb = bits_per_byte(model, held_ids, held_bytes, device)
        print(f"held-out bits per byte {bpb:.3f}", flush=True)
        # Goldens for kiln's family test: fp32 on exactly the saved weights.
        ref = GptOssForCausalLM.from_pretrained(a.out, dtype=torch.float32, attn_implementation="eager").eval()
        short = tok.encode("Once upon a time", add_special_tokens=False).ids
        long_ = tok.encode("<|im_start|>user\nWhat is the json module for?<|im_end|>\n<|im_start|>assistant\n"
                           "The json module encodes and decodes JSON documents, a lightweight data interchange format "
                           "inspired by JavaScript object literal syntax.", add_special_tokens=False).ids
        with torch.no_grad():
            logits_short = ref(torch.tensor([short])).logits[0].float()
            logits_long = ref(torch.tensor([long_])).logits[0].float()

        def greedy(ids, n=12):
            ids, out, margin = list(ids), [], math.inf
            with torch.no_grad():
                for _ in range(n):
                    last = ref(torch.tensor([ids])).logits[0, -1].float()
                    top2 = torch.topk(last, 2).values
                    margin = min(margin, float(top2[0] - top2[1]))
                    out.append(int(torch.argmax(last)))
                    ids.append(out[-1])
            return out, margin

        g_short, m1 = greedy(short)
        g_long, m2 = greedy(long_)
        save_file({"logits_short": logits_short.contiguous(), "logits_long": logits_long.contiguous()},
                  os.path.join(a.out, "golden.safetensors"))
        json.dump({"architecture": "GptOssForCausalLM", "dtype": "bfloat16", "transformers": transformers.__version__,
                   "torch": torch.__version__, "prompt_short": short, "prompt_long": long_, "greedy_short": g_short,
                   "greedy_long": g_long, "min_top2_margin": min(m1, m2)},
                  open(os.path.join(a.out, "golden.json"), "w"), indent=1)

        # Sample replies (transformers, bf16 weights in fp32, temperature 0.7 / top-p 0.9, seeded).
        for i, prompt in enumerate(SAMPLE_PROMPTS):
            text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
            ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])
            torch.manual_seed(100 + i)
            out = ref.generate(ids, max_new_tokens=80, do_sample=True, temperature=0.7, top_p=0.9,
                               eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
            samples.append({"prompt": prompt, "reply": tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)})
    except Exception as e:  # noqa: BLE001 - report and keep the checkpoint
        import traceback
        traceback.print_exc()
        samples.append({"error": repr(e)})
    log = {"parameters": n_params, "steps": step, "batch": a.batch, "seq": SEQ, "train_seconds": round(train_seconds, 1),
           "tokenizer_seconds": round(t_tok, 1), "total_seconds": round(time.time() - t_start, 1),
           "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids)), "heldout_bytes": held_bytes,
           "heldout_bits_per_byte": round(bpb, 4), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "transformers": transformers.__version__, "loss_curve": curve, "samples": samples}
    json.dump(log, open(os.path.join(a.out, "train_log.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in log.items() if k != "loss_curve"}, indent=1), flush=True)


if __name__ == "__main__":
    main()

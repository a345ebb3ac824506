#!/usr/bin/env python3
"""The summary of scripts/gpu-2026-bench: each benchmark's measured time against its roofline.

    python3 scripts/lib/bench_2026.py OUT/2026 [--cpu 0|1]

Reads, per server folder (dsa-sparse, dsa-dense, gdn): lane.meta, inspect.txt (kiln inspect
of the same model and options: bytes per weight group), benchN.meta / .json (kiln bench
serve), metricsN.before / .after (/metrics around the benchmark); and op.json (kiln bench
op: the ceilings). Writes summary.md and summary.json beside them and prints the table.

The roofline (docs/perf/2026-families.md):
- decode step of N sequences (the streams) at context c (its mean while decoding): bytes = the weights of the layers run (routed
  experts: the expected distinct experts of N tokens, E (1 - (1 - k/E)^N), of E experts
  top-k) + lm_head + per sequence the cache it reads (DSA sparse: min(c, top_k) latent
  rows + c indexer keys per layer; dense MLA: c latent rows per layer; Gated DeltaNet: its
  recurrent + conv state read and written, plus c K / V rows per full-attention layer).
  flops = 2 x weight params x N + attention (absorbed MLA: heads x keys x 2 (2 d_latent +
  d_rope)). Floor = max(bytes / copy bandwidth, flops / mma.sync bf16 peak); fraction =
  floor / measured step time. The indexer's scores (fp32, not tensor-core work) count as
  bytes only.
- prefill of one prompt of P tokens: flops = 2 x (weights a token uses: top-k experts +
  shared) x P + causal attention; bytes = every weight once per engine step of the prompt;
  floor = max of the two, fraction = floor / measured prefill time.
"""
import argparse
import json
import math
import os
import re
import sys

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
COUNT = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
CPU_COPY_GBS = 35.3  # docs/PERF.md: the dev VM's host copy bandwidth (assumed on the CPU check)


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def meta(path):
    text = read(path).strip()
    head, _, args = text.partition(" args=")
    kv = dict(w.split("=", 1) for w in head.split() if "=" in w)
    kv["args"] = args
    return kv


def inspect_groups(text):
    """{group: (params, bytes)} from kiln inspect's table, and the recurrent state per sequence."""
    groups, state = {}, 0.0
    row = re.compile(r"^(\S.*?)\s{2,}\S.*?\s{2,}([\d.]+)([KMBT]?)\s+([\d.]+) (B|KiB|MiB|GiB|TiB)\s*$")
    for line in text.splitlines():
        m = row.match(line)
        if m and m.group(1) != "group":
            groups[m.group(1).strip()] = (float(m.group(2)) * COUNT[m.group(3)], float(m.group(4)) * UNITS[m.group(5)])
        s = re.search(r"recurrent state: ([\d.]+) (B|KiB|MiB|GiB) per sequence", line)
        if s:
            state = float(s.group(1)) * UNITS[s.group(2)]
    return groups, state


def metric(text, name, kind):
    m = re.search(name + r'\{[^}]*kind="' + kind + r'"[^}]*\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def step_delta(d, i, kind):
    """(steps, tokens, seconds) of one step kind during benchmark i."""
    b, a = read(f"{d}/metrics{i}.before"), read(f"{d}/metrics{i}.after")
    return tuple(metric(a, "kiln_engine_step_" + m + "_total", kind) - metric(b, "kiln_engine_step_" + m + "_total", kind)
                 for m in ("kind", "tokens", "seconds"))


def text_config(path):
    p = path if path.endswith(".json") else os.path.join(path, "config.json")
    c = json.loads(read(p, "{}"))
    return c.get("text_config", c)


def weights(groups, cfg, n_tokens):
    """(bytes, params) a step of n_tokens reads: every group but the embedding, routed experts
    as the expected distinct experts of n_tokens tokens."""
    total_b = total_p = 0.0
    e = cfg.get("n_routed_experts") or cfg.get("num_experts") or 0
    k = cfg.get("num_experts_per_tok") or 0
    for name, (params, nbytes) in groups.items():
        if name in ("embedding", "total"):
            continue
        if name == "routed experts" and e and k:
            frac = 1.0 - (1.0 - k / e) ** n_tokens
            total_b += nbytes * frac
            total_p += params * min(1.0, k / e)  # flops: each token its k experts
            continue
        total_b += nbytes
        total_p += params
    return total_b, total_p


def n_layers(cfg, serve_args):
    m = re.search(r"--num-layers (\d+)", serve_args)
    n = int(m.group(1)) if m else 0
    full = cfg.get("num_hidden_layers", 0)
    return min(n, full) if n > 0 else full


def analyse(out, cpu):
    op = json.loads(read(f"{out}/op.json", "{}"))
    ceil = op.get("ceilings", {})
    bw = ceil.get("copy_gbs") or (CPU_COPY_GBS if cpu else None)
    peak = ceil.get("mma_bf16_tflops") if not cpu else None
    kv_bytes = 4 if cpu else 2  # the CPU reference's cache is fp32
    rows, notes = [], []
    if not ceil:
        notes.append(f"ceilings: {'assumed ' + str(CPU_COPY_GBS) + ' GB/s host copy (CPU check)' if cpu else 'MISSING (op.json)'}")
    else:
        notes.append(f"ceilings (kiln bench op): copy {bw:.0f} GB/s, mma.sync bf16 {peak:.0f} TFLOP/s")
    for r in op.get("rows", []):
        rows.append({"lane": "op", "op": r["op"], "shape": r["shape"], "rows": r["rows"], "time_us": r["time_us"],
                     "fraction": r["fraction"]})
    for tag in ("dsa-sparse", "dsa-dense", "gdn"):
        d = f"{out}/{tag}"
        if not os.path.isdir(d):
            continue
        if os.path.exists(f"{d}/skipped"):
            rows.append({"lane": tag, "note": "skipped: " + read(f"{d}/skipped").strip()})
            continue
        lm = meta(f"{d}/lane.meta")
        serve = lm.get("args", "") or read(f"{d}/lane.meta").partition("serve=")[2].strip()
        model = serve.split()[0] if serve else "?"
        cfg = text_config(model)
        L = n_layers(cfg, serve)
        groups, state = inspect_groups(read(f"{d}/inspect.txt"))
        mode = lm.get("mode", "")
        i = 0
        while os.path.exists(f"{d}/bench{i + 1}.meta"):
            i += 1
            bm = meta(f"{d}/bench{i}.meta")
            r = {"lane": tag, "mode": mode, "model": os.path.basename(model.rstrip("/")), "layers": L,
                 "kind": bm.get("kind"), "ctx": int(bm.get("ctx", 0)), "conc": int(bm.get("conc", 0))}
            rep = json.loads(read(f"{d}/bench{i}.json", "{}"))
            lv = (rep.get("levels") or [{}])[0].get("summary", {})
            if not lv or lv.get("successful", 0) == 0:
                r["note"] = "no result (" + (read(f"{d}/bench{i}.txt").strip().splitlines() or ["?"])[-1][:120] + ")"
                rows.append(r)
                continue
            r["ttft_p50_ms"] = lv["ttft_ms"]["p50"]
            r["tpot_p50_ms"] = lv["tpot_ms"]["p50"]
            r["itl_p50_ms"] = lv["itl_ms"]["p50"]
            r["out_tok_s"] = lv["output_tokens_per_s"]
            if r["kind"] == "decode":
                steps, toks, secs = step_delta(d, i, "decode")
                r["decode_steps"] = int(steps)
                r["rows_per_step"] = round(toks / steps, 2) if steps else None
                r["step_ms_mean"] = 1e3 * secs / steps if steps else None
                # The step time of `conc` rows: TPOT p50 at one stream; with several, ITL p50 (the
                # typical decode step holds every stream; the median skips the few eager and
                # graph-recording steps, the mixed steps of other streams' prompts and the tail
                # as streams finish, which the engine's mean over decode-only steps includes).
                n = float(r["conc"])
                step_ms = r["tpot_p50_ms"] if r["conc"] == 1 else r["itl_p50_ms"]
                r["step_ms"] = step_ms
                r["tok_s"] = 1e3 * n / step_ms if step_ms else None
                c = int(bm.get("in", r["ctx"])) + int(bm.get("out", 0)) / 2.0  # mean context while decoding
                wb, wp = weights(groups, cfg, n)
                kvb = flops_attn = 0.0
                if tag.startswith("dsa"):
                    lat = cfg.get("kv_lora_rank", 0) + cfg.get("qk_rope_head_dim", 0)
                    keys = c if mode == "dense" else min(c, cfg.get("index_topk", c))
                    kvb = n * L * keys * lat * kv_bytes
                    if mode != "dense":
                        kvb += n * L * c * cfg.get("index_head_dim", 0) * kv_bytes
                    flops_attn = n * L * cfg.get("num_attention_heads", 0) * keys * 2 * (
                        2 * cfg.get("kv_lora_rank", 0) + cfg.get("qk_rope_head_dim", 0))
                else:
                    full = sum(1 for t in (cfg.get("layer_types") or [])[:L] if t == "full_attention")
                    if not cfg.get("layer_types"):
                        full = L // max(1, cfg.get("full_attention_interval", 4))
                    hd = cfg.get("head_dim", 0)
                    kvb = n * (2 * state + full * c * 2 * cfg.get("num_key_value_heads", 0) * hd * kv_bytes)
                    flops_attn = n * full * cfg.get("num_attention_heads", 0) * c * 4 * hd
                bytes_step = wb + kvb
                flops_step = 2 * wp * n + flops_attn
                r["bytes_per_step_mb"] = round(bytes_step / 1e6, 1)
                r["kv_state_mb"] = round(kvb / 1e6, 1)
                floor_bw = bytes_step / (bw * 1e9) if bw else None
                floor_fl = flops_step / (peak * 1e12) if peak else 0.0
                if floor_bw:
                    floor = max(floor_bw, floor_fl)
                    r["bound"] = "bandwidth" if floor_bw >= floor_fl else "compute"
                    r["roofline_tok_s"] = n / floor
                    r["fraction"] = 1e3 * floor / step_ms if step_ms else None
            else:  # prefill of one prompt at a time
                steps, toks, secs = step_delta(d, i, "mixed")
                p = int(bm.get("in", r["ctx"]))
                r["prefill_tok_s_http"] = 1e3 * p / r["ttft_p50_ms"] if r["ttft_p50_ms"] else None
                r["prefill_tok_s"] = toks / secs if secs else r["prefill_tok_s_http"]
                wb, wp = weights(groups, cfg, 2048)
                full = sum(1 for t in (cfg.get("layer_types") or [])[:L] if t == "full_attention")
                hd = cfg.get("head_dim", 0)
                flops = 2 * wp * p + full * cfg.get("num_attention_heads", 0) * 2 * hd * p * p  # causal: half of 4 h d p^2
                steps_per_prompt = max(1, math.ceil(p / 2048))
                t_fl = flops / (peak * 1e12) if peak else 0.0
                t_bw = steps_per_prompt * weights(groups, cfg, 2048)[0] / (bw * 1e9) if bw else 0.0
                floor = max(t_fl, t_bw)
                if floor and r["prefill_tok_s"]:
                    r["bound"] = "compute" if t_fl >= t_bw else "bandwidth"
                    r["roofline_tok_s"] = p / floor
                    r["fraction"] = r["prefill_tok_s"] / r["roofline_tok_s"]
            rows.append(r)
    return rows, notes


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows, notes):
    lines = ["| lane | model, layers | kind | context | streams | step ms (mean) | tok/s | roofline tok/s | fraction | bound | bytes/step MB (cache) | TTFT p50 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["lane"] == "op":
            continue
        if "kind" not in r or "note" in r:
            lines.append(f"| {r['lane']} | {r.get('model', '')} | {r.get('kind', '')} | {r.get('ctx', '')} | "
                         f"{r.get('conc', '')} | {r.get('note', '')} | | | | | | |")
            continue
        if r["kind"] == "decode":
            step = f"{fmt(r.get('step_ms'), '.3f')} ({fmt(r.get('step_ms_mean'), '.3f')})"
            tok = r.get("tok_s")
            extra = f"{fmt(r.get('bytes_per_step_mb'), '.0f')} ({fmt(r.get('kv_state_mb'), '.0f')})"
        else:
            step, tok, extra = "prefill", r.get("prefill_tok_s"), f"HTTP {fmt(r.get('prefill_tok_s_http'), ',.0f')} tok/s"
        frac = r.get("fraction")
        lines.append(f"| {r['lane']} | {r['model']} L{r['layers']} | {r['kind']} | {r['ctx']} | {r['conc']} | {step} | "
                     f"{fmt(tok, ',.0f')} | {fmt(r.get('roofline_tok_s'), ',.0f')} | "
                     f"{'-' if frac is None else f'{100 * frac:.1f}%'} | {r.get('bound', '-')} | {extra} | "
                     f"{fmt(r.get('ttft_p50_ms'), ',.1f')} |")
    # The attention ops alone (kiln bench op), DSA against dense at each step shape.
    ops = [r for r in rows if r.get("lane") == "op"]
    if ops:
        lines += ["", "| op (kiln bench op) | rows | time (us) | fraction of copy bandwidth |", "|---|---|---|---|"]
        lines += [f"| {r['op']} {r['shape']} | {r['rows']} | {r['time_us']:.1f} | {100 * r['fraction']:.1f}% |" for r in ops]
    cmp = []
    for r in ops:
        if r["op"] == "mla_attention" and r["shape"].startswith("DeepSeek-V3.2 DSA:"):
            where = r["shape"].rsplit(", ", 1)[-1]
            dn = next((x for x in ops if x["shape"].startswith("DeepSeek-V3.2 dense") and x["shape"].endswith(where)), None)
            if dn:
                cmp.append(f"- attention op, {where}: DSA {r['time_us']:.1f} us vs dense MLA {dn['time_us']:.1f} us: "
                           f"{dn['time_us'] / r['time_us']:.2f}x")
    # Sparse against dense end to end, at each context and stream count.
    by = {(r["lane"], r.get("ctx"), r.get("conc")): r for r in rows if r.get("kind") == "decode" and r.get("step_ms")}
    for (lane, ctx, conc), r in sorted(by.items(), key=lambda x: (x[0][1], x[0][2])):
        if lane != "dsa-sparse" or ("dsa-dense", ctx, conc) not in by:
            continue
        dn = by[("dsa-dense", ctx, conc)]
        cmp.append(f"- DSA at context {ctx}, {conc} stream(s): sparse {r['step_ms']:.3f} ms vs dense {dn['step_ms']:.3f} ms "
                   f"per decode step: sparse {dn['step_ms'] / r['step_ms']:.2f}x the dense speed")
    return "\n".join(notes + [""] + lines + [""] + cmp) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cpu", default="0")
    a = ap.parse_args()
    rows, notes = analyse(a.out, a.cpu == "1")
    text = table(rows, notes)
    with open(f"{a.out}/summary.md", "w") as f:
        f.write(text)
    with open(f"{a.out}/summary.json", "w") as f:
        json.dump({"notes": notes, "rows": rows}, f, indent=1)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The demo model's loss curve (scripts/demo/train_log.json) as a small self-contained SVG.

    scripts/demo/plot_loss.py scripts/demo/train_log.json docs/images/demo-loss.svg

A log of scripts/demo/train_mtp.py (points with "mtp_loss") also gets the MTP layer's curve.
"""
import json
import sys

log = json.load(open(sys.argv[1]))
pts = [(p["seconds"], p["loss"]) for p in log["loss_curve"]]
mtp = [(p["seconds"], p["mtp_loss"]) for p in log["loss_curve"] if "mtp_loss" in p]
W, H, L, B, T, R = 640, 320, 56, 40, 20, 20
x_max = max(x for x, _ in pts)
y_min, y_max = 2.0, max(y for _, y in pts + mtp)
sx = lambda x: L + (W - L - R) * x / x_max
sy = lambda y: T + (H - T - B) * (y_max - y) / (y_max - y_min)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="#fffdf9"/>']
for y in range(int(y_min), int(y_max) + 1):
    out.append(f'<line x1="{L}" x2="{W - R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#e3ddd4"/>')
    out.append(f'<text x="{L - 8}" y="{sy(y) + 4:.1f}" text-anchor="end" fill="#77716a">{y}</text>')
for x in range(0, int(x_max) + 1, 60):
    out.append(f'<text x="{sx(x):.1f}" y="{H - B + 18}" text-anchor="middle" fill="#77716a">{x} s</text>')
for curve, colour in ((mtp, "#2563eb"), (pts, "#c2410c")):
    if curve:
        path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(curve))
        out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
if mtp:
    out.append(f'<text x="{W - R}" y="{T + 30}" text-anchor="end" fill="#c2410c">main (next token)</text>')
    out.append(f'<text x="{W - R}" y="{T + 46}" text-anchor="end" fill="#2563eb">MTP layer (token after next)</text>')
out.append(f'<text x="{L}" y="{T - 4}" fill="#1f1d1a">training loss (nats per token), {log["steps"]} steps of '
           f'{log["batch"]} x {log["seq"]} tokens on {log["gpu"]}</text>')
out.append(f'<text x="{W - R}" y="{T + 14}" text-anchor="end" fill="#1f1d1a">held-out: '
           f'{log["heldout_bits_per_byte"]:.2f} bits per byte</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")

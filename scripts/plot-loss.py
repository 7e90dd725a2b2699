#!/usr/bin/env python3
"""The loss curve of a training run as an SVG picture, from the JSON lines a training
executable prints with --json ({"step":N,"loss":X,...} and, with --val-data,
{"step":N,"val_loss":X}). Standard library only.

    ./gpt2 --json ... > log.jsonl && scripts/plot-loss.py log.jsonl -o loss.svg
"""
import argparse
import json
import math


def read(path):
    train, val = [], []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "loss" in r:
                train.append((r["step"], r["loss"]))
            if "val_loss" in r:
                val.append((r["step"], r["val_loss"]))
    return train, val


def smooth(points, window):
    out = []
    for i in range(len(points)):
        part = points[max(0, i - window + 1) : i + 1]
        out.append((points[i][0], sum(v for _, v in part) / len(part)))
    return out


def svg(train, val, title):
    w, h, left, right, top, bottom = 640, 360, 56, 16, 32, 40
    steps = [s for s, _ in train + val]
    values = [v for _, v in train + val]
    x0, x1 = min(steps), max(steps)
    y0, y1 = math.floor(min(values)), math.ceil(max(values))
    sx = lambda s: left + (s - x0) / max(x1 - x0, 1) * (w - left - right)
    sy = lambda v: top + (y1 - v) / max(y1 - y0, 1e-9) * (h - top - bottom)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="18">{title}</text>',
    ]
    for v in range(y0, y1 + 1):
        y = sy(v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v}</text>')
    for s in (x0, (x0 + x1) // 2, x1):
        out.append(f'<text x="{sx(s):.1f}" y="{h - bottom + 16}" text-anchor="middle">{s}</text>')
    out.append(f'<text x="{w / 2:.0f}" y="{h - 6}" text-anchor="middle">step</text>')

    def line(points, color, width, label, at):
        d = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in points)
        out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="{width}"/>')
        out.append(f'<text x="{w - right - 140}" y="{at}" fill="{color}">{label}</text>')

    line(train, "#9ab", 1, "training loss", top + 14)
    line(smooth(train, 20), "#246", 2, "training (mean of 20)", top + 30)
    if val:
        line(val, "#c40", 2, "validation loss", top + 46)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="JSON lines of a --json training run")
    p.add_argument("-o", "--out", required=True, help="the SVG file to write")
    p.add_argument("--title", default="loss (nats per token)")
    a = p.parse_args()
    train, val = read(a.log)
    if not train:
        raise SystemExit(f"{a.log}: no {{\"step\", \"loss\"}} lines (run the executable with --json)")
    with open(a.out, "w") as f:
        f.write(svg(train, val, a.title))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

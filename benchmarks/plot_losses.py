#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Loss curves side by side, as an SVG file, with nothing but the standard
library (no matplotlib on the machines these runs come from).

    benchmarks/plot_losses.py --out docs/img/finetune-states.svg \\
        --title "examples/finetune.py, 300 steps" \\
        "fp32 states=runs/fp32.csv" "q8=runs/q8.csv" ...

Each input is LABEL=FILE: a CSV with a header and `step,loss` rows (extra
columns are ignored), or zo-train's --json lines (`"step"` and `"loss"`
keys). --smooth K draws the running mean over K points instead of the raw
values (the raw points stay as faint dots); --ymax caps the y axis (a
diverged run would flatten the others). The y axis is linear; the
numbers behind the plot belong in a table next to it.
"""

import argparse
import csv
import json
import math
import sys
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def read_series(path):
    """[(step, loss)] from a CSV (header with step and loss) or JSON lines."""
    pts = []
    with open(path, newline="") as f:
        head = f.read(1)
        f.seek(0)
        if head == "{":
            for line in f:
                line = line.strip()
                if not line:
                    continue
                d = json.loads(line)
                if "step" in d and "loss" in d:
                    pts.append((float(d["step"]), float(d["loss"])))
        else:
            for row in csv.DictReader(f):
                pts.append((float(row["step"]), float(row["loss"])))
    if not pts:
        raise SystemExit("%s: no (step, loss) points" % path)
    return pts


def running_mean(pts, k):
    out = []
    for i in range(len(pts)):
        w = pts[max(0, i - k + 1):i + 1]
        out.append((pts[i][0], sum(p[1] for p in w) / len(w)))
    return out


def nice_ticks(lo, hi, n=6):
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    t = math.floor(lo / step) * step
    ticks = []
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def plot(series, title, out, smooth, ymax, width=760, height=440):
    ml, mr, mt, mb = 64, 180, 40, 48
    pw, ph = width - ml - mr, height - mt - mb
    xs = [p[0] for _, pts in series for p in pts]
    ys = [p[1] for _, pts in series for p in pts if ymax is None or p[1] <= ymax]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys) if ymax is None else ymax
    xt, yt = nice_ticks(x0, x1), nice_ticks(y0, y1)
    x0, x1 = min(x0, xt[0]), max(x1, xt[-1])
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])

    def X(x):
        return ml + (x - x0) / (x1 - x0 or 1) * pw

    def Y(y):
        return mt + ph - (min(y, y1) - y0) / (y1 - y0 or 1) * ph

    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
         'font-size="12">' % (width, height),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>' % (ml, escape(title))]
    for t in xt:
        s.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (X(t), mt, X(t), mt + ph))
        s.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (X(t), mt + ph + 16, t))
    for t in yt:
        s.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (ml, Y(t), ml + pw, Y(t)))
        s.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (ml - 6, Y(t) + 4, t))
    s.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>' % (ml, mt, pw, ph))
    s.append('<text x="%.1f" y="%d" text-anchor="middle">step</text>' % (ml + pw / 2, height - 10))
    ylab = "loss" + (" (running mean of %d points)" % smooth if smooth > 1 else "")
    s.append('<text transform="translate(16,%.1f) rotate(-90)" text-anchor="middle">%s</text>'
             % (mt + ph / 2, escape(ylab)))
    for i, (label, pts) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        line = running_mean(pts, smooth) if smooth > 1 else pts
        if smooth > 1:
            for x, y in pts:
                if ymax is None or y <= ymax:
                    s.append('<circle cx="%.1f" cy="%.1f" r="1.5" fill="%s" fill-opacity="0.3"/>' % (X(x), Y(y), c))
        d = " ".join("%s%.1f,%.1f" % ("M" if k == 0 else "L", X(x), Y(y)) for k, (x, y) in enumerate(line))
        s.append('<path d="%s" fill="none" stroke="%s" stroke-width="1.6"/>' % (d, c))
        ly = mt + 14 + 20 * i
        s.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>'
                 % (ml + pw + 12, ly - 4, ml + pw + 34, ly - 4, c))
        s.append('<text x="%d" y="%d">%s</text>' % (ml + pw + 40, ly, escape(label)))
    s.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(s) + "\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the SVG file to write")
    ap.add_argument("--title", default="loss")
    ap.add_argument("--smooth", type=int, default=1, help="running mean over K points (default 1: raw)")
    ap.add_argument("--ymax", type=float, default=None, help="cap the y axis")
    ap.add_argument("series", nargs="+", help="LABEL=FILE")
    a = ap.parse_args(argv)
    if a.smooth < 1:
        ap.error("--smooth must be >= 1")
    series = []
    for spec in a.series:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            ap.error("%r: expected LABEL=FILE" % spec)
        series.append((label, read_series(path)))
    plot(series, a.title, a.out, a.smooth, a.ymax)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python
"""Plots for benchmarks/bench.py results (matplotlib, Agg).

    python benchmarks/plot.py benchmarks/results/<gpu>/<suite>.json [...]

fa3/gqa: one PNG per op, subplots (head_dim x causal), grouped bars TFLOPS vs seqlen.
varlen:  one PNG, subplots (op x causal), bars TFLOPS vs average seqlen.
long:    one PNG, TFLOPS vs seqlen and peak memory vs seqlen.
"""
import json
import os
import sys

import matplotlib  # ImportError here is caught by bench.py: plots are optional

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPS = ("fwd", "bwd", "fwdbwd")


def _impls(rows):
    out = []
    for r in rows:
        if r["impl"] not in out and r["status"] == "ok":
            out.append(r["impl"])
    return out


def _label(s):
    return "%dk" % (s // 1024) if s >= 1024 and s % 1024 == 0 else str(s)


def _bars(ax, rows, xkey, impls, title):
    xs = sorted({r[xkey] for r in rows})
    n = max(1, len(impls))
    w = 0.8 / n
    for j, name in enumerate(impls):
        ys = []
        for x in xs:
            r = next((r for r in rows if r["impl"] == name and r[xkey] == x and r["status"] == "ok"),
                     None)
            ys.append(r["tflops"] if r else 0.0)
        pos = [i + (j - (n - 1) / 2) * w for i in range(len(xs))]
        bars = ax.bar(pos, ys, w, label=name)
        if len(xs) * n <= 48:
            for b, y in zip(bars, ys):
                if y > 0:
                    ax.text(b.get_x() + b.get_width() / 2, y, "%.0f" % y if y >= 10 else "%.1f" % y,
                            ha="center", va="bottom", fontsize=5, rotation=90)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([_label(x) for x in xs])
    ax.set_title(title, fontsize=9)
    ax.set_ylabel("TFLOPS")
    ax.grid(axis="y", alpha=0.3)


def _legend(fig, axes):
    h, l = axes[0][0].get_legend_handles_labels()
    fig.legend(h, l, loc="lower center", ncol=min(8, max(1, len(l))), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))


def _title(meta, suite, extra=""):
    dev = meta.get("gpu") or "cpu"
    return "flash_attn_t %s - %s%s (torch %s)" % (suite, dev, extra, meta.get("torch"))


def plot_suite(suite, rows, outdir, meta):
    paths = []
    impls = _impls(rows)
    if not impls:
        return paths
    if suite in ("fa3", "gqa"):
        for op in OPS:
            ro = [r for r in rows if r["op"] == op]
            if not ro:
                continue
            hds = sorted({r["head_dim"] for r in ro})
            cs = sorted({r["causal"] for r in ro})
            fig, axes = plt.subplots(len(hds), len(cs), figsize=(7 * len(cs), 3.6 * len(hds)),
                                     squeeze=False)
            for i, hd in enumerate(hds):
                for j, c in enumerate(cs):
                    sub = [r for r in ro if r["head_dim"] == hd and r["causal"] == c]
                    h = sub[0] if sub else {}
                    _bars(axes[i][j], sub, "seqlen_q", impls,
                          "%s hdim %d, %scausal, Hq=%s Hkv=%s" %
                          (op, hd, "" if c else "non-", h.get("heads_q"), h.get("heads_kv")))
                    axes[i][j].set_xlabel("seqlen (batch*seqlen = %s)" %
                                          (h["batch"] * h["seqlen_q"] if h else "?"))
            _legend(fig, axes)
            fig.suptitle(_title(meta, suite, ", " + op))
            p = os.path.join(outdir, "%s_%s.png" % (suite, op))
            fig.savefig(p, dpi=110)
            plt.close(fig)
            paths.append(p)
    elif suite == "varlen":
        ops = [o for o in OPS if any(r["op"] == o for r in rows)]
        cs = sorted({r["causal"] for r in rows})
        fig, axes = plt.subplots(len(ops), len(cs), figsize=(7 * len(cs), 3.4 * len(ops)),
                                 squeeze=False)
        for i, op in enumerate(ops):
            for j, c in enumerate(cs):
                sub = [r for r in rows if r["op"] == op and r["causal"] == c]
                _bars(axes[i][j], sub, "avg_seqlen", impls,
                      "varlen %s, %scausal, hdim %s" % (op, "" if c else "non-",
                                                        sub[0]["head_dim"] if sub else "?"))
                axes[i][j].set_xlabel("average seqlen (lengths uneven, ~%s tokens)" %
                                      (sub[0].get("total_tokens") if sub else "?"))
        _legend(fig, axes)
        fig.suptitle(_title(meta, suite))
        p = os.path.join(outdir, "varlen.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    elif suite == "long":
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        for name in impls:
            for c in sorted({r["causal"] for r in rows}):
                sub = sorted([r for r in rows if r["impl"] == name and r["causal"] == c
                              and r["status"] == "ok"], key=lambda r: r["seqlen_q"])
                if not sub:
                    continue
                lab = name + (" causal" if c else "")
                ls = "-" if c else "--"
                xs = [r["seqlen_q"] for r in sub]
                axes[0].plot(xs, [r["tflops"] for r in sub], ls, marker="o", label=lab)
                pk = [(r["seqlen_q"], r["peak_bytes"] / 2**30) for r in sub if r["peak_bytes"]]
                if pk:
                    axes[1].plot([a for a, _ in pk], [b for _, b in pk], ls, marker="o", label=lab)
        for ax, yl in ((axes[0], "TFLOPS (fwd)"), (axes[1], "peak memory per call (GiB)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("seqlen (batch 1)")
            ax.set_ylabel(yl)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[1]:
                ax.legend(fontsize=7)
        axes[1].set_yscale("log")
        fig.suptitle(_title(meta, suite))
        fig.tight_layout()
        p = os.path.join(outdir, "long.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def main(argv):
    for path in argv:
        with open(path) as f:
            data = json.load(f)
        suite = os.path.splitext(os.path.basename(path))[0]
        for p in plot_suite(suite, data["rows"], os.path.dirname(path), data["meta"]):
            print(p)


if __name__ == "__main__":
    main(sys.argv[1:])

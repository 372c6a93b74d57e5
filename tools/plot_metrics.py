#!/usr/bin/env python3
"""Draws the curves of a tessel-train run as a PNG: training and evaluation
loss against the iteration (left; with the evaluation accuracy of a
classifier on a second axis, and BERT's two evaluation terms), learning
rate and throughput (right).

    /usr/bin/python3 tools/plot_metrics.py output/gpt2_tiny [--out curves.png] [--title TEXT]

Reads <run>/metrics.jsonl (or a metrics.jsonl path given directly); writes
<run>/curves.png unless --out says otherwise. Needs matplotlib
(Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys


def load(path):
    train, evals = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{number}: not a JSON object ({e})")
            (evals if "eval_loss" in record else train).append(record)
    return train, evals


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a tessel-train output directory or its metrics.jsonl")
    p.add_argument("--out", help="the PNG to write (default: <run>/curves.png)")
    p.add_argument("--title", default=None)
    args = p.parse_args()
    path = args.run if args.run.endswith(".jsonl") else os.path.join(args.run, "metrics.jsonl")
    if not os.path.exists(path):
        sys.exit(f"plot_metrics: {path} does not exist; expected the metrics.jsonl tessel-train writes")
    train, evals = load(path)
    if not train:
        sys.exit(f"plot_metrics: {path} holds no training records")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([r["iteration"] for r in train], [r["loss"] for r in train], label="training loss", color="#1f77b4")
    if evals:
        left.plot([r["iteration"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="evaluation loss",
                  color="#d62728")
    for key, label, color in (("eval_mlm_loss", "evaluation masked-LM loss", "#ff7f0e"),
                              ("eval_sentence_loss", "evaluation sentence-order loss", "#8c564b")):
        terms = [r for r in evals if key in r]
        if terms:
            left.plot([r["iteration"] for r in terms], [r[key] for r in terms], "^--", label=label, color=color)
    left.set_xlabel("iteration")
    left.set_ylabel("cross-entropy (nats)")
    left.grid(alpha=0.3)
    accuracy = [r for r in evals if "eval_accuracy" in r]
    if accuracy:
        acc = left.twinx()
        acc.plot([r["iteration"] for r in accuracy], [100 * r["eval_accuracy"] for r in accuracy], "s--",
                 color="#9467bd", label="evaluation accuracy")
        acc.set_ylabel("accuracy (%)")
        acc.set_ylim(0, 100)
        lines = left.get_legend_handles_labels()[0] + acc.get_legend_handles_labels()[0]
        left.legend(lines, [line.get_label() for line in lines], loc="center right")
    else:
        left.legend()
    right.plot([r["iteration"] for r in train], [r["lr"] for r in train], color="#2ca02c", label="learning rate")
    right.set_xlabel("iteration")
    right.set_ylabel("learning rate")
    right.grid(alpha=0.3)
    speed = right.twinx()
    speed.plot([r["iteration"] for r in train], [r["tokens_per_s"] for r in train], color="#ff7f0e", alpha=0.7,
               label="tokens/s")
    speed.set_ylabel("tokens/s")
    lines = right.get_legend_handles_labels()[0] + speed.get_legend_handles_labels()[0]
    right.legend(lines, [line.get_label() for line in lines], loc="center right")
    first, last = train[0]["loss"], train[-1]["loss"]
    fig.suptitle(args.title or f"{os.path.normpath(args.run)}: loss {first:.3f} -> {last:.3f} "
                 f"in {train[-1]['iteration']} iterations")
    fig.tight_layout()
    out = args.out or os.path.join(os.path.dirname(path), "curves.png")
    fig.savefig(out, dpi=110)
    print(f"plot_metrics: {out}")


if __name__ == "__main__":
    main()

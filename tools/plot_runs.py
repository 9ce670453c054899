#!/usr/bin/env python3
"""Compare several Strata runs in one matplotlib figure, from their metrics.jsonl files.

Usage:
  python3 tools/plot_runs.py out/run-a out/run-b [--metric loss|val_loss|lr|grad_norm|tokens_per_s]
                             [--out runs.png] [--smooth N] [--log-y]

Each argument is a run directory (its metrics.jsonl is read) or a metrics.jsonl path; a run is labelled by its
directory name. Without --metric the figure shows train loss (solid) and val loss (dashed, with markers) of every
run, one colour per run; with --metric it shows that one metric. --smooth N draws a trailing mean over N logged
points over the faint raw curve (val loss is never smoothed: it is already an average). --log-y uses a log y-axis.
The figure goes to --out (default runs.png), whose path is printed.

metrics.jsonl is read the way loss.svg reads it: lines with an "event" key, lines that do not parse and null
(NaN) values are skipped, and when a step repeats (a resumed run) the later record wins. Without --log-y the loss
axis may leave out the first few points of a run when they sit far above the rest, as loss.svg does.

matplotlib is a dev-tool dependency only (python3 -m pip install matplotlib); the Agg backend needs no display.
"""
import argparse
import json
import math
import os
import sys

METRICS = ["loss", "val_loss", "lr", "grad_norm", "tokens_per_s"]


def metrics_file(arg):
    """The metrics.jsonl path and the run label for a run directory or a metrics file."""
    if os.path.isfile(arg) or arg.endswith(".jsonl"):
        path = arg
    else:
        path = os.path.join(arg, "metrics.jsonl")  # a run directory, or a missing one to report
    run_dir = os.path.dirname(os.path.abspath(path))
    return path, os.path.basename(run_dir) or run_dir


def read_series(path, keys):
    """{key: ([steps], [values])}, by step, for each key in keys."""
    by_step = {key: {} for key in keys}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the torn last line of a killed run
            if not isinstance(record, dict) or "event" in record:
                continue
            step = record.get("step")
            if not isinstance(step, (int, float)):
                continue
            for key in keys:
                if key not in record:
                    continue
                value = record[key]
                if isinstance(value, (int, float)) and math.isfinite(value):
                    by_step[key][step] = float(value)
                else:
                    by_step[key].pop(step, None)  # a later NaN replaces the earlier point with none
    out = {}
    for key, points in by_step.items():
        steps = sorted(points)
        out[key] = (steps, [points[s] for s in steps])
    return out


def trailing_mean(values, window):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def robust_top(series):
    """The loss axis top that leaves out only early points far above the rest (loss.svg's rule), or None."""
    points = [(s, v) for steps, values in series for s, v in zip(steps, values)]
    if len(points) < 10:
        return None
    values = sorted(v for _, v in points)
    lowest, highest = values[0], values[-1]
    first, last = min(s for s, _ in points), max(s for s, _ in points)
    early_end = first + 0.1 * (last - first)
    top = max([values[int(0.98 * (len(values) - 1))]] + [v for s, v in points if s > early_end])
    return top if highest - lowest > 2 * (top - lowest) else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or metrics.jsonl files")
    parser.add_argument("--metric", choices=METRICS, help="one metric instead of train and val loss")
    parser.add_argument("--out", default="runs.png", help="the image to write (default runs.png)")
    parser.add_argument("--smooth", type=int, default=1, metavar="N", help="trailing mean over N points")
    parser.add_argument("--log-y", action="store_true", help="log-scale y-axis")
    args = parser.parse_args()
    if args.smooth < 1:
        parser.error("--smooth must be at least 1")

    runs = []
    for arg in args.runs:
        path, label = metrics_file(arg)
        if not os.path.isfile(path):
            print(f"plot_runs.py: no metrics file at {path}", file=sys.stderr)
            return 1
        runs.append((path, label))
    # Two runs named alike (out/a/run, out/b/run) are told apart by their parent directory.
    labels = [label for _, label in runs]
    runs = [(path, label if labels.count(label) == 1 else
             os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(path)))) + "/" + label)
            for path, label in runs]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [args.metric] if args.metric else ["loss", "val_loss"]
    fig, ax = plt.subplots(figsize=(10, 6), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = []
    for i, (path, label) in enumerate(runs):
        colour = colours[i % len(colours)]
        series = read_series(path, keys)
        for key in keys:
            steps, values = series[key]
            if not steps:
                continue
            drawn.append((steps, values))
            name = label if args.metric else f"{label} {'val' if key == 'val_loss' else 'train'}"
            if key == "val_loss":
                ax.plot(steps, values, color=colour, linestyle="--", marker="o", markersize=4, linewidth=1.6,
                        label=name)
            elif args.smooth > 1:
                ax.plot(steps, values, color=colour, linewidth=0.8, alpha=0.25)
                ax.plot(steps, trailing_mean(values, args.smooth), color=colour, linewidth=1.5, label=name)
            else:
                ax.plot(steps, values, color=colour, linewidth=1.2, label=name)
    if not drawn:
        print(f"plot_runs.py: no {' or '.join(keys)} values in {', '.join(p for p, _ in runs)}", file=sys.stderr)
        return 1

    if args.log_y:
        ax.set_yscale("log")
    elif keys[0] in ("loss", "val_loss"):
        top = robust_top(drawn)
        if top is not None:
            lowest = min(min(values) for _, values in drawn)
            ax.set_ylim(lowest - 0.05 * (top - lowest), top + 0.05 * (top - lowest))
            ax.annotate("early points above the axis are cut off", xy=(1, 1), xycoords="axes fraction",
                        xytext=(0, 4), textcoords="offset points", ha="right", va="bottom", fontsize=8,
                        color="#666666")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss" if not args.metric else args.metric.replace("_", " "))
    ax.set_title("train and val loss" if not args.metric else args.metric.replace("_", " "))
    ax.grid(True, color="#e6e6e6")
    ax.set_axisbelow(True)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A PNG of the standard RL curves from a run's CSV metrics (Lightning's CSVLogger format)."""
from __future__ import annotations

import csv
import os

CURVES = [("reward", "reward"), ("val/accuracy", "held-out accuracy"), ("kl", "KL to reference"),
          ("entropy", "entropy"), ("completions/mean_length", "completion length"),
          ("learning_rate", "learning rate"), ("throughput/tokens_per_s", "throughput (tokens/s)"),
          ("sampling/parity_max", "parity probe: max |Δ log p|"),
          ("sampling/logp_diff/max", "sampled vs trained: max |Δ log p|")]
# The rollout engine's log-probs against the trainer's: ~1e-7 to 1, and 0 when they agree exactly.
LOG_Y = ("sampling/parity_max", "sampling/logp_diff/max")
COLUMNS = 5


def read_metrics(path: str) -> dict[str, list[tuple[float, float]]]:
    """``{metric: [(step, value), ...]}`` from a CSVLogger ``metrics.csv``."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no metrics file at {path!r}: point at a run written by CSVLogger")
    series: dict[str, list[tuple[float, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = float(row.get("step") or 0)
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in ("", None):
                    series.setdefault(key, []).append((step, float(value)))
    return series


def plot_metrics(csv_path: str, png_path: str) -> str:
    """Write one panel per standard curve present in ``csv_path`` (rows of up to ``COLUMNS``);
    returns ``png_path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(csv_path)
    panels = [(k, title) for k, title in CURVES if k in series]
    if not panels:
        raise ValueError(f"{csv_path!r} holds none of the metrics {[k for k, _ in CURVES]}")
    cols = min(len(panels), COLUMNS)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.remove()
    for ax, (key, title) in zip(axes.flat, panels):
        steps, values = zip(*series[key])
        ax.plot(steps, values, marker="o" if len(values) < 20 else None)
        if key in LOG_Y:
            ax.set_yscale("symlog", linthresh=1e-8)  # a log axis that also shows an exact 0
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path

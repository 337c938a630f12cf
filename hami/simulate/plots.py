"""PNG plots of simulation runs for `hami simulate --report DIR` (matplotlib, Agg backend: no display needed).

Two figures, one line or bar group per policy, so `--compare` reads at a glance:
- `allocation_vs_arrival.png`: GPU allocation (percent of cards' cores) against arrived GPU demand
  (percent of capacity), with the ideal "everything that arrived fits" line, as in the FGD paper;
- `model_utilisation.png`: per card model, the share of cores and of memory allocated at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from hami.simulate.engine import Mode, RunResult  # noqa: E402

ALLOCATION_PNG = "allocation_vs_arrival.png"
MODELS_PNG = "model_utilisation.png"

#: Line style per policy: policies often pack alike for a while, and a line drawn on top of another
#: must not hide it, so each is thinner than the one before and dashed differently.
LINE_STYLES = ("-", "--", "-.", ":")


def _line_style(k: int) -> dict[str, object]:
    return {"linestyle": LINE_STYLES[k % len(LINE_STYLES)], "linewidth": max(1.0, 2.8 - 0.6 * k)}


def allocation_plot(results: Sequence[RunResult], path: str | Path) -> None:
    """Allocation curves (one per policy) into `path`: against arrived demand in fill mode (with the
    ideal line), against trace time (hours) in trace mode. Raises OSError when the file cannot be written."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    fill = not results or results[0].mode is Mode.FILL
    top = 100.0 if fill else 0.0
    for k, r in enumerate(results):
        if fill:
            xs = [0.0] + [c.arrival for c in r.curve]
            ys = [0.0] + [c.gpu_allocation_ratio * 100 for c in r.curve]
            ax.plot(xs, ys, label=r.policy.label, **_line_style(k))
        else:
            xs = [(c.time or 0.0) / 3600 for c in r.curve]
            ys = [c.gpu_allocation_ratio * 100 for c in r.curve]
            # Allocation holds between events: a step, not a slope from one sample to the next.
            ax.plot(xs, ys, label=r.policy.label, drawstyle="steps-post", **_line_style(k))
        top = max(top, xs[-1] if xs else 0.0)
    if fill:
        ax.plot([0, 100, top], [0, 100, 100], linestyle=":", color="grey", linewidth=1, label="ideal")
        ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
        ax.set_title("GPU allocation vs arrivals (fill mode)")
        ax.set_ylim(0, 105)
    else:
        ax.set_xlabel("trace time (hours)")
        ax.set_title("GPU allocation over the trace (trace mode)")
        ax.set_ylim(bottom=0)
    ax.set_ylabel("GPU allocation (% of cores)")
    ax.set_xlim(0, top or 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def model_plot(results: Sequence[RunResult], path: str | Path) -> None:
    """Per-model core and memory allocation into `path`: at the end of a fill run, at the peak of a trace
    run. Raises OSError."""
    models = sorted({m for r in results for m in r.per_model})
    first = results[0].per_model if results else {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110, sharey=True)
    width = 0.8 / max(1, len(results))
    for k, r in enumerate(results):
        xs = [i + (k - (len(results) - 1) / 2) * width for i in range(len(models))]
        cores, mem = [], []
        per_model = r.per_model if r.mode is Mode.FILL else r.peak_per_model
        for m in models:
            u = per_model.get(m)
            cores.append(100 * u.usedcores / u.devcore if u and u.devcore else 0.0)
            mem.append(100 * u.usedmem / u.devmem if u and u.devmem else 0.0)
        axes[0].bar(xs, cores, width=width, label=r.policy.label)
        axes[1].bar(xs, mem, width=width, label=r.policy.label)
    labels = [f"{m}\n({first[m].cards})" if m in first else m for m in models]
    for ax, what in zip(axes, ("cores", "memory"), strict=True):
        ax.set_xticks(range(len(models)), labels, fontsize=8)
        suffix = "" if results[0].mode is Mode.FILL else " (at peak)"
        ax.set_title(f"{what} allocated per card model{suffix}")
        ax.set_ylim(0, 105)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("% of the model's capacity (cards in brackets)")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=max(1, len(results)), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path)
    plt.close(fig)


def write_report(results: Sequence[RunResult], directory: str | Path) -> list[Path]:
    """Write both figures into `directory` (created if needed); returns the paths. Raises OSError."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / ALLOCATION_PNG, d / MODELS_PNG]
    allocation_plot(results, paths[0])
    model_plot(results, paths[1])
    return paths

"""PNG plots of simulation runs for `hami simulate --report DIR` (matplotlib, Agg backend: no display needed).

Each file is named for what it shows, and each title names the input (`report.input_title`: ``pods.csv
on nodes.csv, fill to 130 %, seed 1``); one line or bar group per policy, so `--compare` reads at a glance:
- `gpu_allocation_vs_arrival.png` (fill) / `gpu_allocation_over_time.png` (trace): the cards' capacity
  taken (per card the largest of its cores, memory and slot shares) against arrived GPU demand (percent
  of capacity, with the ideal "everything that arrived fits" line, as in the FGD paper, from the start
  state's allocation when pods were placed) or against trace time;
- `allocation_by_card_model.png`: per card model, the share of capacity, of cores and of memory taken;
- `fragmentation_vs_arrival.png` (fill) / `fragmentation_over_time.png` (trace): the cluster's expected
  fragmentation at every checkpoint, in cards and in percent of the free capacity;
- `node_fragmentation.png`: which nodes are fragmented: the nodes ranked by fragmented capacity, and per
  card model the free and the fragmented capacity;
- `failure_reasons.png`: failed pods per reason and policy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from hami.simulate.allocation import figures_of  # noqa: E402
from hami.simulate.engine import Mode, RunResult  # noqa: E402
from hami.simulate.fragmeter import top_nodes  # noqa: E402
from hami.simulate.workload import Workload  # noqa: E402

ALLOCATION_PNG = {Mode.FILL: "gpu_allocation_vs_arrival.png", Mode.TRACE: "gpu_allocation_over_time.png"}
MODELS_PNG = "allocation_by_card_model.png"
FRAGMENTATION_PNG = {Mode.FILL: "fragmentation_vs_arrival.png", Mode.TRACE: "fragmentation_over_time.png"}
NODES_PNG = "node_fragmentation.png"
FAILURES_PNG = "failure_reasons.png"

#: Reason categories drawn in `failure_reasons.png` (the most common over all policies; the rest are
#: summed as "other").
MAX_REASONS = 8

#: Line style per policy: policies often pack alike for a while, and a line drawn on top of another
#: must not hide it, so each is thinner than the one before and dashed differently.
LINE_STYLES = ("-", "--", "-.", ":")


def _line_style(k: int) -> dict[str, object]:
    return {"linestyle": LINE_STYLES[k % len(LINE_STYLES)], "linewidth": max(1.0, 2.8 - 0.6 * k)}


def _title(fig, what: str, title: str) -> None:
    """The figure's two-line title: what it shows, then the input (half an inch above the axes)."""
    fig.suptitle(f"{what}\n{title}" if title else what, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))


def _fill(results: Sequence[RunResult]) -> bool:
    return not results or results[0].mode is Mode.FILL


def ideal_line(start: float, top: float) -> tuple[list[float], list[float]]:
    """The ideal curve of a fill run, (arrived demand %, capacity taken %): everything that arrives
    fits, on top of the `start` percent already taken, until the cards are full; drawn up to `top`."""
    full = max(0.0, 100.0 - start)
    return [0.0, full, max(top, full)], [start, 100.0, 100.0]


def allocation_plot(results: Sequence[RunResult], path: str | Path, title: str = "") -> None:
    """Allocation curves (one per policy) into `path`: against arrived demand in fill mode (with the
    ideal line), against trace time (hours) in trace mode; `title` names the input. Raises OSError when
    the file cannot be written."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    fill = _fill(results)
    top = 100.0 if fill else 0.0
    # Pods already placed (--from-cluster, a snapshot) hold capacity before the first arrival: the
    # curves and the ideal line start there (the same start for every policy).
    start = 0.0
    if results and results[0].start_allocation is not None:
        start = results[0].start_allocation.capacity * 100
    for k, r in enumerate(results):
        if fill:
            xs = [0.0] + [c.arrival for c in r.curve]
            ys = [start] + [c.capacity_allocation_ratio * 100 for c in r.curve]
            ax.plot(xs, ys, label=r.policy.label, **_line_style(k))
        else:
            xs = [(c.time or 0.0) / 3600 for c in r.curve]
            ys = [c.capacity_allocation_ratio * 100 for c in r.curve]
            # Allocation holds between events: a step, not a slope from one sample to the next.
            ax.plot(xs, ys, label=r.policy.label, drawstyle="steps-post", **_line_style(k))
        top = max(top, xs[-1] if xs else 0.0)
    if fill:
        ax.plot(*ideal_line(start, top), linestyle=":", color="grey", linewidth=1, label="ideal")
        ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
        ax.set_ylim(0, 105)
    else:
        ax.set_xlabel("trace time (hours)")
        ax.set_ylim(bottom=0)
    ax.set_ylabel("GPU capacity taken (% of the cards)")
    ax.set_xlim(0, top or 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    what = "GPU capacity taken vs arrived demand" if fill else "GPU capacity taken over the trace"
    _title(fig, what, title)
    fig.savefig(path)
    plt.close(fig)


def model_plot(results: Sequence[RunResult], path: str | Path, title: str = "") -> None:
    """Per-model core and memory allocation into `path`: at the end of a fill run, at the peak of a trace
    run; `title` names the input. Raises OSError."""
    models = sorted({m for r in results for m in r.per_model})
    first = results[0].per_model if results else {}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.6), dpi=110, sharey=True)
    width = 0.8 / max(1, len(results))
    for k, r in enumerate(results):
        xs = [i + (k - (len(results) - 1) / 2) * width for i in range(len(models))]
        taken, cores, mem = [], [], []
        per_model = r.per_model if r.mode is Mode.FILL else r.peak_per_model
        for m in models:
            u = per_model.get(m)
            f = figures_of(u) if u is not None else None
            taken.append(100 * f.capacity if f else 0.0)
            cores.append(100 * f.cores if f else 0.0)
            mem.append(100 * f.memory if f else 0.0)
        for ax, ys in zip(axes, (taken, cores, mem), strict=True):
            ax.bar(xs, ys, width=width, label=r.policy.label)
    labels = [f"{m}\n({first[m].cards})" if m in first else m for m in models]
    for ax, what in zip(axes, ("capacity (largest of cores, memory, slots)", "cores", "memory"), strict=True):
        ax.set_xticks(range(len(models)), labels, fontsize=8)
        ax.set_title(f"{what} allocated", fontsize=9)
        ax.set_ylim(0, 105)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("% of the model's capacity (cards in brackets)")
    axes[2].legend(loc="lower right", fontsize=8)
    when = "at the end" if _fill(results) else "at the peak"
    _title(fig, f"Allocation by card model, {when}", title)
    fig.savefig(path)
    plt.close(fig)


def fragmentation_plot(results: Sequence[RunResult], path: str | Path, title: str = "") -> None:
    """The expected fragmentation at every checkpoint, one line per policy, in cards (left) and in
    percent of the free GPU capacity (right); against arrived demand (fill) or trace time (trace).
    Raises OSError."""
    fill = _fill(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110, sharex=True)
    for k, r in enumerate(results):
        points = [c for c in r.checkpoints if c.fragmentation is not None]
        xs = [c.arrival if fill else (c.time or 0.0) / 3600 for c in points]
        axes[0].plot(xs, [c.fragmentation.fragmented for c in points], marker=".", label=r.policy.label,
                     **_line_style(k))  # fmt: skip
        ratio = [c.fragmentation.ratio for c in points]
        axes[1].plot(xs, [100 * x if x is not None else float("nan") for x in ratio], marker=".",
                     label=r.policy.label, **_line_style(k))  # fmt: skip
    axes[0].set_ylabel("fragmented GPU capacity (cards)")
    axes[1].set_ylabel("fragmented (% of the free GPU capacity)")
    axes[1].set_ylim(0, 105)
    for ax in axes:
        ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)" if fill else "trace time (hours)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[1].legend(loc="upper left", fontsize=8)
    what = "Expected fragmentation (free capacity the learned workload cannot use), every 10 % of arrivals"
    _title(fig, what, title)
    fig.savefig(path)
    plt.close(fig)


def node_fragmentation_plot(results: Sequence[RunResult], path: str | Path, title: str = "") -> None:
    """Which nodes are fragmented: left, every GPU node's fragmented capacity, most fragmented first, one
    line per policy (and a grey one for the start, when the runs began with pods placed); right, per card model, the free capacity (light) and the part of it that is
    fragmented (dark). At the end of a fill run, at the checkpoint of highest allocation of a trace run.
    Raises OSError."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110)
    models = sorted({x.models for r in results for x in r.node_fragmentation})
    width = 0.8 / max(1, len(results))
    for k, r in enumerate(results):
        ranked = top_nodes(r.node_fragmentation, cordoned=False)  # cordoned nodes: never a choice
        axes[0].plot(range(1, len(ranked) + 1), [x.fragmented for x in ranked], label=r.policy.label,
                     **_line_style(k))  # fmt: skip
        free: Counter[str] = Counter()
        frag: Counter[str] = Counter()
        for x in r.node_fragmentation:
            free[x.models] += x.free
            frag[x.models] += x.fragmented
        xs = [i + (k - (len(results) - 1) / 2) * width for i in range(len(models))]
        bars = axes[1].bar(xs, [free[m] for m in models], width=width, alpha=0.35)
        axes[1].bar(xs, [frag[m] for m in models], width=width, color=bars.patches[0].get_facecolor()[:3] if bars.patches else None,
                    label=r.policy.label)  # fmt: skip
    if results and results[0].start_fragmentation is not None:
        ranked = top_nodes(results[0].start_node_fragmentation, cordoned=False)
        axes[0].plot(range(1, len(ranked) + 1), [x.fragmented for x in ranked], color="grey", linestyle=":",
                     linewidth=1.5, label="start (pods placed)")  # fmt: skip
    axes[0].set_xlabel("nodes, most fragmented first")
    axes[0].set_ylabel("fragmented GPU capacity (cards)")
    axes[0].set_xlim(left=0)
    axes[0].set_ylim(bottom=0)
    axes[0].grid(True, alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].set_xticks(range(len(models)), models, fontsize=8)
    axes[1].set_ylabel("GPU capacity (cards): free (light), fragmented (dark)")
    axes[1].grid(True, axis="y", alpha=0.3)
    axes[1].legend(loc="upper right", fontsize=8)
    when = "at the end" if _fill(results) else "at the checkpoint of highest capacity taken"
    _title(fig, f"Fragmented nodes, {when}", title)
    fig.savefig(path)
    plt.close(fig)


def failure_plot(results: Sequence[RunResult], path: str | Path, title: str = "") -> None:
    """Failed pods per reason category (the `MAX_REASONS` most common over all policies, the rest as
    "other"), one bar per policy. Raises OSError."""
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.failure_reasons)
    shown = [k for k, _ in total.most_common(MAX_REASONS)]
    rest = len(total) > len(shown)
    labels = shown + (["other"] if rest else [])
    fig, ax = plt.subplots(
        figsize=(9, 1.6 + 0.45 * max(1, len(labels)) * max(1, len(results)) ** 0.5), dpi=110
    )
    if not labels:
        ax.text(0.5, 0.5, "no pod failed", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        height = 0.8 / max(1, len(results))
        for k, r in enumerate(results):
            counts = [r.failure_reasons.get(m, 0) for m in shown]
            if rest:
                counts.append(sum(n for m, n in r.failure_reasons.items() if m not in shown))
            ys = [i + (k - (len(results) - 1) / 2) * height for i in range(len(labels))]
            ax.barh(ys, counts, height=height, label=r.policy.label)
        ax.set_yticks(range(len(labels)), [x if len(x) <= 48 else x[:45] + "..." for x in labels], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("failed pods")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    _title(fig, "Failed pods by reason", title)
    fig.savefig(path)
    plt.close(fig)


def write_report(
    results: Sequence[RunResult], directory: str | Path, workload: Workload | None = None
) -> list[Path]:
    """Write every figure into `directory` (created if needed), titled with `workload`'s inputs when
    given; returns the paths. Raises OSError."""
    from hami.simulate.report import input_title

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    mode = results[0].mode if results else Mode.FILL
    title = input_title(results, workload) if workload is not None else ""
    out = []
    for name, plot in (
        (ALLOCATION_PNG[mode], allocation_plot),
        (MODELS_PNG, model_plot),
        (FRAGMENTATION_PNG[mode], fragmentation_plot),
        (NODES_PNG, node_fragmentation_plot),
        (FAILURES_PNG, failure_plot),
    ):
        plot(results, d / name, title)
        out.append(d / name)
    return out

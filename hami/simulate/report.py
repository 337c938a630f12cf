"""What a simulation run prints and writes: the summary table, the JSON object, the placements CSV, the
annotations, and the per-node fragmentation and failure-reason CSVs of `--report`.

Kept apart from the engine so that the figures have one definition each (docs/simulate.md lists every
field with its unit) and the engine stays free of formatting.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hami.simulate.allocation import figures_of
from hami.simulate.engine import Checkpoint, Mode, ModelUsage, RunResult
from hami.simulate.fragmeter import ClusterFragmentation, NodeFragmentation, top_nodes
from hami.simulate.workload import SimNode, Workload, model_of
from hami.tools.table import table

PLACEMENT_COLUMNS = (
    "pod",
    "container",
    "node",
    "card_uuid",
    "card_model",
    "mem_mib",
    "cores",
    "reason",
    "policy",
)


#: Most fragmented nodes per policy in the summary text and in the JSON (all of them go to the CSV of
#: `--report`).
TOP_NODES_TEXT = 5
TOP_NODES_JSON = 20

#: A node counts as fragmented above this many cards of fragmented capacity (rounding noise below).
FRAGMENTED_CARDS = 0.005

NODE_FRAGMENTATION_COLUMNS = (
    "policy",
    "node",
    "models",
    "cards",
    "free_cards",
    "fragmented_cards",
    "fragmentation_ratio",
    "cordoned",
)
FAILURE_REASON_COLUMNS = ("policy", "reason", "pods")

NODE_FRAGMENTATION_CSV = "node_fragmentation.csv"
FAILURE_REASONS_CSV = "failure_reasons.csv"


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def input_title(results: Sequence[RunResult], workload: Workload) -> str:
    """What a plot shows the run of: ``pods.csv on nodes.csv, fill to 130 %, seed 1`` (file names
    without their directories; the generator as it describes itself)."""

    def name(source: str) -> str:
        p = Path(source)
        return p.name if p.is_file() else source

    what = f"{name(workload.pods_source)} on {name(workload.nodes_source)}"
    if not results:
        return what
    r = results[0]
    if r.mode is Mode.FILL:
        return f"{what}, fill to {r.arrival_target:g} %, seed {r.seed}"
    return f"{what}, trace replay"


def _node_json(x: NodeFragmentation) -> dict[str, Any]:
    return {
        "node": x.node,
        "models": x.models,
        "cards": x.cards,
        "free_cards": _r(x.free, 4),
        "fragmented_cards": _r(x.fragmented, 4),
        "fragmentation_ratio": _r(x.ratio),
    }


def _figures_json(u: ModelUsage) -> dict[str, Any]:
    f = figures_of(u)
    return {
        "cards": u.cards,
        "capacity_allocation_ratio": _r(f.capacity),
        "gpu_allocation_ratio": _r(f.cores),
        "memory_allocation_ratio": _r(f.memory),
        "slot_allocation_ratio": _r(f.slots),
    }


def _fragmentation_json(r: RunResult) -> dict[str, Any]:
    over_time = []
    for c in r.checkpoints:
        f = c.fragmentation
        if f is None:
            continue
        over_time.append(
            {
                "arrival": c.arrival,
                "time": c.time,
                "capacity_allocation_ratio": _r(c.capacity_allocation_ratio),
                "gpu_allocation_ratio": _r(c.gpu_allocation_ratio),
                "free_cards": _r(f.free, 4),
                "fragmented_cards": _r(f.fragmented, 4),
                "fragmentation_ratio": _r(f.ratio),
                "workload_shapes": f.shapes,
            }
        )
    at = r.node_fragmentation_at
    out: dict[str, Any] = {
        "over_time": over_time,
        "nodes": _nodes_json(
            r.node_fragmentation, "end" if at is None else {"arrival": at.arrival, "time": at.time}
        ),
    }
    if r.start_fragmentation is not None:
        out["start"] = _nodes_json(r.start_node_fragmentation, "start")
    return out


def _nodes_json(nodes: Sequence[NodeFragmentation], at: Any) -> dict[str, Any]:
    free = sum(x.free for x in nodes)
    frag = sum(x.fragmented for x in nodes)
    closed = [x for x in nodes if x.cordoned]
    return {
        "at": at,
        "gpu_nodes": len(nodes),
        "fragmented_nodes": sum(1 for x in nodes if x.fragmented > FRAGMENTED_CARDS),
        "free_cards": _r(free, 4),
        "fragmented_cards": _r(frag, 4),
        "fragmentation_ratio": _r(frag / free if free > 0 else None),
        "top": [_node_json(x) for x in top_nodes(list(nodes), TOP_NODES_JSON, cordoned=False)],
        "cordoned": {
            "nodes": len(closed),
            "free_cards": _r(sum(x.free for x in closed), 4),
            "top": [_node_json(x) for x in top_nodes(closed, TOP_NODES_JSON)],
        },
    }


def result_json(r: RunResult, workload: Workload) -> dict[str, Any]:
    """One run as a JSON-ready dict (ratios 0..1, arrivals in percent of GPU capacity, times seconds/ms)."""
    out: dict[str, Any] = {
        "policy": r.policy.label,
        "node_policy": r.policy.node,
        "card_policy": r.policy.card,
        "mode": r.mode.value,
        "arrival": r.arrival_target,
        "seed": r.seed,
        "nodes_source": workload.nodes_source,
        "pods_source": workload.pods_source,
        "nodes": r.nodes,
        "gpus": r.gpus,
        "pods": r.pods,
        "gpu_pods": r.gpu_pods,
        "scheduled": r.scheduled,
        "failed": r.failed,
        "failed_gpu_pods": r.failed_gpu_pods,
        "failed_gpu_demand": _r(r.failed_gpu_demand, 3),
        "failed_gpu_demand_pct": _r(failed_demand_pct(r), 3),
        "deleted": r.deleted,
        "capacity_allocation_ratio": _r(r.capacity_allocation_ratio),
        "gpu_allocation_ratio": _r(r.gpu_allocation_ratio),
        "memory_allocation_ratio": _r(r.memory_allocation_ratio),
        "slot_allocation_ratio": _r(r.slot_allocation_ratio),
        "peak_capacity_allocation_ratio": _r(r.peak_capacity_allocation_ratio),
        "peak_gpu_allocation_ratio": _r(r.peak_gpu_allocation_ratio),
        "peak_memory_allocation_ratio": _r(r.peak_memory_allocation_ratio),
        "peak_slot_allocation_ratio": _r(r.peak_slot_allocation_ratio),
        "peak_time": r.peak_time,
        "arrived_gpu_demand": _r(r.arrived_gpu_demand, 3),
        "first_failure_arrival": _r(r.first_failure_arrival, 3),
        "elapsed_s": _r(r.elapsed_s, 3),
        "decision_ms": {
            "count": len(r.decision_s),
            "p50": _r(r.decision_percentile_ms(50), 3),
            "p99": _r(r.decision_percentile_ms(99), 3),
            "max": _r(max(r.decision_s) * 1000 if r.decision_s else None, 3),
        },
        "failure_reasons": dict(r.failure_reasons.most_common()),
        "warnings": dict(r.warnings.most_common()),
        "per_model": {
            m: _figures_json(u) for m, u in (r.per_model if r.mode is Mode.FILL else r.peak_per_model).items()
        },
        "per_family": {
            f: _figures_json(u)
            for f, u in (r.per_family if r.mode is Mode.FILL else r.peak_per_family).items()
        },
    }
    if r.mode is Mode.TRACE:
        out["peak_reason"] = peak_reason(r)
    out["fragmentation"] = _fragmentation_json(r)
    if r.mode is Mode.FILL:
        out["allocation_at_arrival"] = [
            {
                "arrival": c.arrival,
                "capacity_allocation_ratio": _r(c.capacity_allocation_ratio),
                "gpu_allocation_ratio": _r(c.gpu_allocation_ratio),
                "memory_allocation_ratio": _r(c.memory_allocation_ratio),
                "slot_allocation_ratio": _r(c.slot_allocation_ratio),
            }
            for c in r.checkpoints
        ]
    return out


def results_json(results: Sequence[RunResult], workload: Workload, *, compare: bool) -> dict[str, Any]:
    """The object `--json` prints: one run's dict, or with `--compare` an object keyed by policy label."""
    if not compare:
        return result_json(results[0], workload)
    return {r.policy.label: result_json(r, workload) for r in results}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def cluster_line(nodes: Sequence[SimNode], source: str) -> str:
    """``cluster: 20 nodes, 97 GPUs (G2 56, T4 16, ...) from SOURCE``: the card models most common first."""
    models = Counter(model_of(c.type) for n in nodes for c in n.cards)
    mix = ", ".join(f"{m} {k}" for m, k in sorted(models.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"cluster: {len(nodes)} nodes, {sum(models.values())} GPUs ({mix}) from {source}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The summary's tables: the first column (policy, node) left, the figures right, under a rule."""
    return table(header, rows, left=(0,), rule=True)


def peak_reason(r: RunResult) -> str:
    """Why a trace run's peak GPU allocation is what it is: when it happened, how many GPU pods were
    refused by then, and the most common reason (a low peak without failures means the trace itself
    never asked for more)."""
    when = "-" if r.peak_time is None else f"{r.peak_time:g} s"
    if not r.failed_gpu_pods:
        return (
            f"peak capacity {r.peak_capacity_allocation_ratio * 100:.2f}% at trace time {when}; no GPU pod was refused, so the "
            "peak is what the trace asked for at that time, not a limit of the cluster"
        )
    top = r.failure_reasons.most_common(1)[0][0] if r.failure_reasons else "-"
    return (
        f"peak capacity {r.peak_capacity_allocation_ratio * 100:.2f}% at trace time {when}; {r.failed_gpu_pods} GPU pods were "
        f"refused over the trace, most often for {top}"
    )


def _frag_cell(c: Checkpoint) -> str:
    f = c.fragmentation
    if f is None:
        return "-"
    return f"{f.fragmented:.1f} ({'-' if f.ratio is None else f'{f.ratio * 100:.0f}%'})"


def _where(at: Checkpoint | None) -> str:
    if at is None:
        return "at the end of the run"
    when = "" if at.time is None else f", trace time {at.time:g} s"
    return f"at {at.arrival:g}% arrivals{when}, the checkpoint of highest capacity taken"


def _fragmentation_lines(results: Sequence[RunResult]) -> list[str]:
    """Fragmentation over time (per checkpoint) and the most fragmented nodes, per policy."""
    lines: list[str] = []
    r0 = results[0]
    fill = r0.mode is Mode.FILL
    marks = [c.arrival for c in r0.checkpoints if c.fragmentation is not None]
    if marks and fill:
        head = ["policy", *(f"{m:g}%" for m in marks)]
        for title, cell in (
            (
                "expected fragmentation at arrived demand: free GPU capacity (cards) that no pod of the "
                "learned workload could use",
                lambda f: f"{f.fragmented:.1f}",
            ),
            (
                "... as percent of the free GPU capacity",
                lambda f: "-" if f.ratio is None else f"{f.ratio * 100:.0f}",
            ),
        ):
            body = []
            for r in results:
                by = {c.arrival: c.fragmentation for c in r.checkpoints}
                body.append([r.policy.label, *(cell(by[m]) if by.get(m) else "-" for m in marks)])
            lines += ["", f"{title}:", *_table(head, body)]
    elif marks:
        lines += [
            "",
            "expected fragmentation at the checkpoint of highest capacity taken (cards, percent of free):",
        ]
        for r in results:
            best = max(
                (c for c in r.checkpoints if c.fragmentation), key=lambda c: c.capacity_allocation_ratio
            )
            lines.append(
                f"  {r.policy.label}: {_frag_cell(best)} at {best.arrival:g}% arrivals, trace time {best.time:g} s"
            )
    if r0.start_fragmentation is not None:
        # The start is the same for every policy: shown once.
        lines += _node_table(
            f"most fragmented nodes at the start (the pods already placed), {_frag_sum(r0.start_fragmentation)}",
            r0.start_node_fragmentation,
        )
    for r in results:
        lines += _node_table(
            f"most fragmented nodes, {r.policy.label} ({_where(r.node_fragmentation_at)})",
            r.node_fragmentation,
        )
    return lines


def _frag_sum(f: ClusterFragmentation) -> str:
    share = "" if f.ratio is None else f", {f.ratio * 100:.0f}% of the free"
    return f"{f.fragmented:.1f} of {f.free:.1f} free cards fragmented{share}"


def _node_table(title: str, nodes: Sequence[NodeFragmentation]) -> list[str]:
    closed = [x for x in nodes if x.cordoned]
    apart = []
    if closed:
        # Cordoned nodes take no new pod: all their free capacity counts as fragmented, which would
        # put them at the top; they are listed apart.
        apart = [f"  cordoned (take no new pod, left out above): {len(closed)} nodes, "
                 f"{sum(x.free for x in closed):.2f} free cards: " + ", ".join(x.node for x in top_nodes(closed, TOP_NODES_TEXT))
                 + (", ..." if len(closed) > TOP_NODES_TEXT else "")]  # fmt: skip
    top = [
        x for x in top_nodes(list(nodes), TOP_NODES_TEXT, cordoned=False) if x.fragmented > FRAGMENTED_CARDS
    ]
    if not top:
        return ["", f"{title}: none", *apart]
    rows = [
        [
            x.node,
            x.models,
            str(x.cards),
            f"{x.free:.2f}",
            f"{x.fragmented:.2f}",
            "-" if x.ratio is None else f"{x.ratio * 100:.0f}%",
        ]
        for x in top
    ]
    return [
        "",
        f"{title}:",
        *_table(["node", "models", "cards", "free", "fragmented", "share"], rows),
        *apart,
    ]


def failed_demand_pct(r: RunResult) -> float:
    """The failed pods' GPU demand in percent of the cluster's GPU capacity (the unit of arrivals)."""
    return r.failed_gpu_demand / r.gpu_capacity * 100 if r.gpu_capacity else 0.0


def _alloc_cells(r: RunResult, fill: bool) -> list[str]:
    if fill:
        return [_pct(x) for x in (r.capacity_allocation_ratio, r.gpu_allocation_ratio,
                                  r.memory_allocation_ratio, r.slot_allocation_ratio)]  # fmt: skip
    return [_pct(x) for x in (r.peak_capacity_allocation_ratio, r.peak_gpu_allocation_ratio,
                              r.peak_memory_allocation_ratio, r.peak_slot_allocation_ratio)]  # fmt: skip


def _family_lines(results: Sequence[RunResult]) -> list[str]:
    """Per vendor family, one row per policy (only for fleets of more than one family)."""
    fill = results[0].mode is Mode.FILL
    fams = sorted({f for r in results for f in (r.per_family if fill else r.peak_per_family)})
    if len(fams) < 2:
        return []
    rows = []
    for r in results:
        per = r.per_family if fill else r.peak_per_family
        for fam in fams:
            u = per.get(fam)
            if u is None:
                continue
            f = figures_of(u)
            rows.append(
                [
                    r.policy.label,
                    fam,
                    str(u.cards),
                    *(_pct(x) for x in (f.capacity, f.cores, f.memory, f.slots)),
                ]
            )
    when = "at the end" if fill else "at the peak"
    return ["", f"allocation per vendor family ({when}):",
            *_table(["policy", "family", "cards", "capacity", "cores", "memory", "slots"], rows)]  # fmt: skip


def summary_text(results: Sequence[RunResult], workload: Workload) -> str:
    """The human summary: what was replayed, one row per policy (pods placed and failed, the failed GPU
    demand, allocation by capacity, cores, memory and slots), allocation at arrivals, per vendor family,
    fragmentation, failure reasons."""
    r0 = results[0]
    if r0.mode is Mode.FILL:
        what = f"fill mode: pods drawn with seed {r0.seed} until arrived GPU demand reached {r0.arrival_target:g}%"
    else:
        what = "trace mode: arrivals and deletions in trace time order"
    lines = [
        f"hami simulate - {what}",
        cluster_line(workload.nodes, workload.nodes_source),
        f"workload: {len(workload.pods)} pods from {workload.pods_source}",
        "",
    ]
    # At the end of a trace every pod has left: the peak is the figure that says something there.
    fill = r0.mode is Mode.FILL
    alloc = ["capacity", "cores", "memory", "slots"]
    if not fill:
        alloc = [f"peak {x}" for x in alloc]
    header = ["policy", "pods", "scheduled", "failed", "GPU pods failed", "failed demand", *alloc,
              "1st fail at", "p50 ms", "p99 ms", "time s"]  # fmt: skip
    rows = []
    for r in results:
        p50, p99 = r.decision_percentile_ms(50), r.decision_percentile_ms(99)
        rows.append(
            [
                r.policy.label,
                str(r.pods),
                str(r.scheduled),
                str(r.failed),
                str(r.failed_gpu_pods),
                f"{failed_demand_pct(r):.1f}%",
                *_alloc_cells(r, fill),
                "-" if r.first_failure_arrival is None else f"{r.first_failure_arrival:.1f}%",
                "-" if p50 is None else f"{p50:.2f}",
                "-" if p99 is None else f"{p99:.2f}",
                f"{r.elapsed_s:.1f}",
            ]
        )
    lines += _table(header, rows)
    lines += [
        "",
        *(
            f"  {line}"
            for line in (
                "pods: pods submitted (GPU and CPU-only); scheduled / failed: placed / refused (not retried); "
                "GPU pods failed: the refused pods that ask for GPUs",
                "failed demand: the GPU demand of the refused pods, percent of the cluster's GPU capacity",
                f"{alloc[0]}: the cards' capacity taken, per card the largest of its used cores, memory and slots "
                "(what binds a card), averaged over the cards"
                + (" (at the end of the run)" if fill else " (highest point of the trace)"),
                "cores / memory / slots: card cores / card memory / sharer slots held, percent of the cluster's",
                "1st fail at: arrived GPU demand (percent of GPU capacity) when the first GPU pod failed",
                "p50 / p99 ms: the scheduler core's decision time per GPU pod; time s: the replay's wall time",
            )
        ),
    ]
    if not fill:
        for r in results:
            lines.append(f"  {r.policy.label}: {peak_reason(r)}")
    if r0.mode is Mode.FILL and r0.checkpoints:
        lines += [
            "",
            "capacity taken at arrived demand (percent of the cards' capacity; arrivals in percent of GPU capacity):",
        ]
        marks = [c.arrival for c in r0.checkpoints]
        head = ["policy", *(f"{m:g}%" for m in marks)]
        body = []
        for r in results:
            by = {c.arrival: c.capacity_allocation_ratio for c in r.checkpoints}
            body.append([r.policy.label, *(f"{by[m] * 100:.1f}" if m in by else "-" for m in marks)])
        lines += _table(head, body)
    lines += _family_lines(results)
    lines += _fragmentation_lines(results)
    reasons = [(r.policy.label, r.failure_reasons.most_common(3)) for r in results if r.failure_reasons]
    if reasons:
        lines += ["", "most common failure reasons (pods):"]
        for label, top in reasons:
            lines.append(f"  {label}: " + "; ".join(f"{n} {k}" for k, n in top))
    warned = [(r.policy.label, r.warnings.most_common(3)) for r in results if r.warnings]
    if warned:
        lines += ["", "warnings from the scheduler core (pods):"]
        for label, top in warned:
            lines.append(f"  {label}: " + "; ".join(f"{n} x {k}" for k, n in top))
    return "\n".join(lines)


def write_placements(path: str | Path, results: Sequence[RunResult]) -> int:
    """Write one row per (pod, container, card) of every run (`PLACEMENT_COLUMNS`); returns the row count.

    A pod without cards (CPU-only) has a node and empty card fields; a failed pod has empty node and card
    fields and its `reason`. `policy` tells the runs of `--compare` apart. Raises OSError.
    """
    n = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PLACEMENT_COLUMNS)
        for r in results:
            for p in r.placements or ():
                w.writerow(
                    [
                        p.pod,
                        p.container,
                        p.node,
                        p.card_uuid,
                        p.card_model,
                        "" if p.mem_mib is None else p.mem_mib,
                        "" if p.cores is None else p.cores,
                        p.reason,
                        r.policy.label,
                    ]
                )
                n += 1
    return n


def write_annotations(path: str | Path, results: Sequence[RunResult]) -> int:
    """Write one JSON line per scheduled GPU pod: ``{"policy", "pod", "annotations"}`` with the
    annotations the extender would patch (`hami.io/vgpu-node`, `vgpu-time`, device lists). Returns the
    line count. Raises OSError."""
    n = 0
    with open(path, "w") as f:
        for r in results:
            for pod, annos in r.annotations or ():
                f.write(json.dumps({"policy": r.policy.label, "pod": pod, "annotations": annos}) + "\n")
                n += 1
    return n


def write_node_fragmentation(path: str | Path, results: Sequence[RunResult]) -> int:
    """Write every GPU node of every run (`NODE_FRAGMENTATION_COLUMNS`; cards of capacity, ratio 0..1,
    empty when nothing is free), most fragmented first per policy, after the rows of policy ``start``
    when the runs began with pods placed (the same start for every policy); returns the row count.
    Raises OSError."""
    n = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(NODE_FRAGMENTATION_COLUMNS)
        tables = [(r.policy.label, r.node_fragmentation) for r in results]
        if results and results[0].start_fragmentation is not None:
            tables.insert(0, ("start", results[0].start_node_fragmentation))
        for label, nodes in tables:
            for x in top_nodes(list(nodes)):
                ratio = x.ratio
                w.writerow(
                    [label, x.node, x.models, x.cards, f"{x.free:.4f}", f"{x.fragmented:.4f}",
                     "" if ratio is None else f"{ratio:.6f}", "true" if x.cordoned else "false"]
                )  # fmt: skip
                n += 1
    return n


def write_failure_reasons(path: str | Path, results: Sequence[RunResult]) -> int:
    """Write failed pods per (policy, reason category), most common first (`FAILURE_REASON_COLUMNS`);
    returns the row count. Raises OSError."""
    n = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FAILURE_REASON_COLUMNS)
        for r in results:
            for reason, pods in r.failure_reasons.most_common():
                w.writerow([r.policy.label, reason, pods])
                n += 1
    return n


def write_tables(results: Sequence[RunResult], directory: str | Path) -> list[Path]:
    """The CSV files of `--report DIR`: `node_fragmentation.csv` and `failure_reasons.csv` (the
    directory must exist). Returns the paths. Raises OSError."""
    d = Path(directory)
    paths = [d / NODE_FRAGMENTATION_CSV, d / FAILURE_REASONS_CSV]
    write_node_fragmentation(paths[0], results)
    write_failure_reasons(paths[1], results)
    return paths

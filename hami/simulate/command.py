"""`hami simulate`: the command line of the simulator: flags to policies, inputs to runs, runs to output.

Kept out of `hami.cli` so the top-level command stays a thin dispatcher and so tests can call
`run_simulate(args)` directly. Every input problem is an `InvalidRequest` (a `TraceError` names file,
line and column); `hami.cli` turns it into one line on stderr and exit status 2. The flags are
`hami.simulate.arguments`, the inputs `hami.simulate.inputs`, the progress display
`hami.simulate.progress`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from hami.config import CARD_POLICIES, NODE_POLICIES, DeviceConfig
from hami.errors import ApiError, InvalidRequest
from hami.simulate.engine import Mode, Policy, RunResult, parse_policy, run
from hami.simulate.inputs import check_workload, load_config, load_workload
from hami.simulate.mixed import config_for, parse_vendor_shares
from hami.simulate.priority import PendingQueue, PriorityReport, assign, check_mode
from hami.simulate.progress import ProgressBar, ProgressLines
from hami.simulate.start import begin

#: `--arrival` without the flag: the end of the FGD paper's plots.
DEFAULT_ARRIVAL = 130.0

#: Largest `--arrival`: far past the point where a cluster is full (the FGD paper stops at 130 %); a
#: larger target only makes the run longer, and an unbounded one never ends.
MAX_ARRIVAL = 1000.0


def _policies(args: argparse.Namespace, config: DeviceConfig) -> tuple[list[Policy], bool]:
    sched = config.scheduler
    given = [
        f
        for f, v in (
            ("--policy", args.policy),
            ("--node-policy", args.node_policy),
            ("--card-policy", args.card_policy),
        )
        if v is not None
    ]
    for flag in given:
        if not getattr(args, flag[2:].replace("-", "_")).strip():
            raise InvalidRequest(f"{flag}: empty value; e.g. {flag} binpack")
    if args.compare is not None:
        if given:
            raise InvalidRequest(f"--compare: give the policies in the list, not also {given[0]}")
        specs = [s for s in args.compare.split(",") if s.strip()]
        if not specs:
            raise InvalidRequest("--compare: empty list; e.g. --compare binpack,spread")
        policies = [parse_policy(s, default_node=sched.nodeSchedulerPolicy, flag="--compare") for s in specs]
        labels = [p.label for p in policies]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise InvalidRequest(f"--compare: policy {sorted(dup)[0]!r} given twice")
        return policies, True
    if args.policy is not None:
        base = parse_policy(args.policy, default_node=sched.nodeSchedulerPolicy)
    else:
        base = parse_policy(
            f"{sched.nodeSchedulerPolicy}/{sched.gpuSchedulerPolicy.replace(',', '+')}", flag="--config"
        )
    node, card = base.node, base.card
    if args.node_policy is not None:
        value = args.node_policy.strip().lower()
        if value not in NODE_POLICIES:
            raise InvalidRequest(
                f"--node-policy: {args.node_policy!r} is not a node policy; valid: {', '.join(NODE_POLICIES)}"
            )
        node = value
    if args.card_policy is not None:
        try:
            card = parse_policy(f"{node}/{args.card_policy.replace(',', '+')}", flag="--card-policy").card
        except InvalidRequest:
            raise InvalidRequest(
                f"--card-policy: {args.card_policy!r} is not a card policy; valid: {', '.join(CARD_POLICIES)} "
                "or a comma chain of them such as numa,binpack"
            ) from None
    return [Policy(node=node, card=card)], False


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse output paths that cannot be written before the replay, not after minutes of it."""
    for flag, value, example in (
        ("--placements", args.placements, "out/placements.csv"),
        ("--annotations", args.annotations, "out/annotations.jsonl"),
    ):
        if value is None:
            continue
        path = Path(value)
        if not value or path.is_dir():
            what = "an empty name" if not value else "a directory"
            raise InvalidRequest(f"{flag}: {value!r} is {what}; give a file name such as {example}")
        if not path.resolve().parent.is_dir():
            raise InvalidRequest(f"{flag}: directory {path.resolve().parent} does not exist")
    if args.report is not None:
        if importlib.util.find_spec("matplotlib") is None:
            raise InvalidRequest(
                "--report writes PNG plots with matplotlib, which is not installed; install the simulate "
                "extra: pip install -e '.[simulate]' (or pip install matplotlib)"
            )
        path = Path(args.report)
        if not args.report or (path.exists() and not path.is_dir()):
            raise InvalidRequest(
                f"--report: {args.report!r} is a file; give a directory (created if missing)"
            )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InvalidRequest(f"--report: cannot create directory {args.report}: {e.strerror}") from None


def run_simulate(
    args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run `hami simulate` with parsed `args`; returns the exit status. Raises InvalidRequest / OSError."""
    from hami.simulate.report import results_json, summary_text, write_annotations, write_placements

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if getattr(args, "from_cluster", False) and args.config is None:
        # What the scheduler reads, so the cluster's Ascend nodes and NPU pods are not dropped.
        from hami.simulate.fromcluster import api_error_status, cluster_config

        try:
            config = cluster_config(args, stderr)
        except ApiError as e:
            return api_error_status(e)
    else:
        if getattr(args, "device_configmap", None):
            raise InvalidRequest("--device-configmap: only with --from-cluster and without --config")
        config = load_config(args.config)
    if getattr(args, "vendors", None):
        config = config_for(config, parse_vendor_shares(args.vendors))  # Ascend/Iluvatar are switched vendors
    policies, compare = _policies(args, config)
    mode = Mode(args.mode)
    if mode is Mode.TRACE and args.arrival is not None:
        raise InvalidRequest(
            "--arrival: only for --mode fill; a trace replays every arrival and deletion at its own time"
        )
    arrival = DEFAULT_ARRIVAL if args.arrival is None else args.arrival
    if mode is Mode.FILL and not (math.isfinite(arrival) and 0 < arrival <= MAX_ARRIVAL):
        raise InvalidRequest(
            f"--arrival: {arrival:g} is not a valid fill target; valid: a percent of the cluster's GPU "
            f"capacity above 0 and at most {MAX_ARRIVAL:g} (e.g. 130)"
        )
    _check_outputs(args)
    try:
        workload, placed = load_workload(args, config)
    except ApiError as e:
        from hami.simulate.fromcluster import api_error_status

        return api_error_status(e)
    for note in workload.notes:
        stderr.write(f"hami simulate: warning: {note}\n")
    from_empty = getattr(args, "from_empty", False)
    what_if = getattr(args, "what_if_shape", None)
    # The what-if needs GPUs in the cluster, not a workload.
    check_workload(replace(workload, pods=[]) if what_if else workload, Mode.TRACE if what_if else mode)
    trace = mode is Mode.TRACE and not what_if
    kept_pods, start = begin(placed, workload.nodes, config=config, trace=trace, from_empty=from_empty)
    if what_if:
        from hami.simulate.whatif import run_what_if

        return run_what_if(
            args, config, workload, kept_pods, policies, start=start, stdout=stdout, stderr=stderr
        )
    if getattr(args, "current_policy", None) is not None:
        raise InvalidRequest("--current-policy: only with --what-if-shape")
    if args.progress and args.no_progress:
        raise InvalidRequest("--progress: not together with --no-progress")
    show_progress = not args.no_progress and stderr.isatty()
    priorities = getattr(args, "priorities", None)
    preemption = getattr(args, "preemption", None)
    queued = check_mode(priorities, preemption, trace=mode is Mode.TRACE)
    if queued:
        workload = assign(workload, priorities, pods_file=args.pods, seed=args.seed)
    reports: dict[str, PriorityReport] = {}
    results: list[RunResult] = []
    for policy in policies:
        queue = PendingQueue(preemption=preemption == "on") if queued else None
        bar: ProgressBar | ProgressLines | None = None
        if args.progress:
            bar = ProgressLines(stderr, policy.label)
        elif show_progress:
            bar = ProgressBar(stderr, policy.label)
        try:
            results.append(
                run(
                    workload,
                    config=config,
                    policy=policy,
                    mode=mode,
                    arrival=arrival,
                    seed=args.seed,
                    placements=args.placements is not None,
                    annotations=args.annotations is not None,
                    progress=bar,
                    placed=kept_pods,
                    queue=queue,
                )
            )
        finally:
            if bar is not None:
                bar.close()
        if queue is not None:
            reports[policy.label] = queue.report
    payload = results_json(results, workload, compare=compare)
    for label, report in reports.items():
        (payload[label] if compare else payload)["priorities"] = report.json()
    # The start state is the same for every policy; said only where the input can hold placed pods.
    say_start = bool(placed.source) or from_empty
    if say_start:
        for one in payload.values() if compare else (payload,):
            one["start"] = start.json()
    # Files first, then stdout: a reader that closes the pipe early (`| head`) must not cost the files.
    notes = []
    if args.placements is not None:
        rows = write_placements(args.placements, results)
        notes.append(f"placements: {rows} rows written to {args.placements}\n")
    if args.annotations is not None:
        rows = write_annotations(args.annotations, results)
        notes.append(f"annotations: {rows} pods written to {args.annotations}\n")
    if args.report is not None:
        from hami.simulate.plots import write_report
        from hami.simulate.report import write_tables

        paths = write_report(results, args.report, workload) + write_tables(results, args.report)
        paths.append(Path(args.report) / "summary.json")
        paths[-1].write_text(json.dumps(payload, indent=2) + "\n")
        notes.append("report: " + ", ".join(str(p) for p in paths) + "\n")
    if args.json:
        json.dump(payload, stdout, indent=2)
        stdout.write("\n")
    else:
        text = summary_text(results, workload)
        for label, report in reports.items():
            text += "\n" + "\n".join(report.text(label))
        if say_start:
            lines = text.split("\n")
            at = next((i + 1 for i, line in enumerate(lines) if line.startswith("workload:")), 0)
            text = "\n".join([*lines[:at], start.text(), *lines[at:]])
        stdout.write(text + "\n")
        for note in notes:
            stdout.write(note)
    return 0

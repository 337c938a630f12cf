"""`hami simulate`: the command line of the simulator (arguments, input selection, output).

Kept out of `hami.cli` so the top-level command stays a thin dispatcher and so tests can call
`run_simulate(args)` directly. Every input problem is an `InvalidRequest` (a `TraceError` names file,
line and column); `hami.cli` turns it into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from hami.config import DeviceConfig, load_config_file
from hami.errors import InvalidRequest
from hami.simulate import kubeyaml, openb
from hami.simulate.engine import Mode, Policy, RunResult, parse_policy, run
from hami.simulate.generate import DEFAULT_NODES, DEFAULT_PODS, generate_nodes, generate_pods
from hami.simulate.workload import DEFAULT_GPU_MODELS, SimNode, SimPod, Workload, parse_gpu_models

YAML_SUFFIXES = (".yaml", ".yml", ".json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `simulate` subcommand's flags (documented in docs/simulate.md)."""
    inputs = p.add_argument_group(
        "input (without --nodes/--pods a built-in generated cluster/workload is used)"
    )
    inputs.add_argument("--nodes", metavar="FILE", help="openb node CSV or Kubernetes YAML with Node objects")
    inputs.add_argument("--pods", metavar="FILE", help="openb pod CSV or Kubernetes YAML with Pod manifests")
    inputs.add_argument(
        "--gpu-models",
        metavar="MODEL=MiB,...",
        default="",
        help="card memory per model for CSV input, on top of "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_GPU_MODELS.items()),
    )
    inputs.add_argument(
        "--config", metavar="FILE", help="device-config YAML (split count, scaling, defaults)"
    )
    inputs.add_argument(
        "--generate",
        metavar="NODES,PODS",
        default=f"{DEFAULT_NODES},{DEFAULT_PODS}",
        help="size of the built-in cluster and workload (default %(default)s)",
    )
    run_g = p.add_argument_group("replay")
    run_g.add_argument(
        "--mode", choices=[m.value for m in Mode], default=Mode.FILL.value, help="default fill"
    )
    run_g.add_argument(
        "--arrival",
        type=float,
        default=130.0,
        metavar="PCT",
        help="fill mode: stop when arrived GPU demand reaches PCT %% of capacity (default 130)",
    )
    run_g.add_argument(
        "--seed", type=int, default=0, help="fill-mode sampling and generator seed (default 0)"
    )
    pol = p.add_argument_group("policies")
    pol.add_argument(
        "--policy",
        metavar="POLICY",
        help="binpack, spread (node and card), a card policy (numa, mutex, topology-aware) or NODE/CARD "
        "such as binpack/spread; default: the config's policies (binpack/spread)",
    )
    pol.add_argument("--node-policy", metavar="POLICY", help="node policy: binpack or spread")
    pol.add_argument(
        "--card-policy", metavar="POLICY", help="card policy or comma chain, e.g. binpack or numa,binpack"
    )
    pol.add_argument(
        "--compare", metavar="P1,P2,...", help="run several policies on the same input, one table"
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    out.add_argument("--placements", metavar="FILE.csv", help="write one row per (pod, container, card)")
    out.add_argument(
        "--annotations",
        metavar="FILE.jsonl",
        help="write the extender's annotations of every scheduled GPU pod",
    )
    out.add_argument("--report", metavar="DIR", help="write PNG plots (and summary.json) into DIR")
    out.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")


class ProgressBar:
    """A one-line bar on a terminal (`stream` must be a TTY; callers check)."""

    def __init__(self, stream: TextIO, label: str, width: int = 30) -> None:
        self.stream, self.label, self.width = stream, label, width
        self.last = -1.0
        self.started = time.monotonic()

    def __call__(self, done: float) -> None:
        if done - self.last < 0.005 and done < 1.0:
            return
        self.last = done
        fill = int(done * self.width)
        bar = "#" * fill + "-" * (self.width - fill)
        self.stream.write(
            f"\r{self.label:<18} [{bar}] {done * 100:5.1f}%  {time.monotonic() - self.started:5.1f}s"
        )
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r" + " " * (self.width + 48) + "\r")
        self.stream.flush()


def _is_yaml(path: str) -> bool:
    if path.lower().endswith(YAML_SUFFIXES):
        return True
    if path.lower().endswith(".csv"):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.readline()
    except OSError:
        return False
    # A CSV header is one comma-separated line; YAML starts with a key, '---' or a comment.
    return ":" in head or head.startswith(("---", "#", "{"))


def _policies(args: argparse.Namespace, config: DeviceConfig) -> tuple[list[Policy], bool]:
    sched = config.scheduler
    if args.compare:
        if args.policy or args.node_policy or args.card_policy:
            raise InvalidRequest(
                "--compare: give the policies in the list, not also --policy/--node-policy/--card-policy"
            )
        specs = [s for s in args.compare.split(",") if s.strip()]
        if not specs:
            raise InvalidRequest("--compare: empty list; e.g. --compare binpack,spread")
        policies = [parse_policy(s, default_node=sched.nodeSchedulerPolicy) for s in specs]
        labels = [p.label for p in policies]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise InvalidRequest(f"--compare: policy {sorted(dup)[0]!r} given twice")
        return policies, True
    if args.policy:
        base = parse_policy(args.policy, default_node=sched.nodeSchedulerPolicy)
    else:
        base = parse_policy(f"{sched.nodeSchedulerPolicy}/{sched.gpuSchedulerPolicy.replace(',', '+')}")
    node, card = base.node, base.card
    if args.node_policy:
        node = parse_policy(f"{args.node_policy}/{card.replace(',', '+')}").node
    if args.card_policy:
        card = parse_policy(f"{node}/{args.card_policy.replace(',', '+')}").card
    return [Policy(node=node, card=card)], False


def _generate_size(value: str) -> tuple[int, int]:
    n, sep, p = value.partition(",")
    if not sep or not n.strip().isdigit() or not p.strip().isdigit() or int(n) < 1 or int(p) < 1:
        raise InvalidRequest(
            f"--generate: {value!r} must be NODES,PODS with two integers >= 1, e.g. 200,3000"
        )
    return int(n), int(p)


def load_workload(args: argparse.Namespace, config: DeviceConfig) -> Workload:
    """Nodes and pods from the files given (openb CSV or YAML by suffix/content), the generator for the rest."""
    models = parse_gpu_models(args.gpu_models)
    size_nodes, size_pods = _generate_size(args.generate)
    nodes: list[SimNode]
    pods: list[SimPod]
    if args.nodes:
        if _is_yaml(args.nodes):
            nodes = kubeyaml.load_nodes(args.nodes, config=config)
        else:
            nodes = openb.load_nodes(args.nodes, config=config, gpu_models=models)
        nodes_source = args.nodes
    else:
        nodes = generate_nodes(size_nodes, config=config, seed=args.seed)
        nodes_source = f"built-in generator (seed {args.seed}, {size_nodes} nodes)"
    if args.pods:
        if _is_yaml(args.pods):
            pods = kubeyaml.load_pods(args.pods, config=config)
        else:
            pods = openb.load_pods(args.pods, config=config, gpu_models=models)
        pods_source = args.pods
    else:
        capacity = sum(c.devcore for n in nodes for c in n.cards) / 100
        pods = generate_pods(
            size_pods, config=config, gpu_capacity=max(capacity, 1.0), seed=args.seed, gpu_models=models
        )
        pods_source = f"built-in generator (seed {args.seed}, {size_pods} pods)"
    return Workload(
        nodes=nodes, pods=pods, nodes_source=nodes_source, pods_source=pods_source, gpu_models=models
    )


def run_simulate(
    args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run `hami simulate` with parsed `args`; returns the exit status. Raises InvalidRequest / OSError."""
    from hami.simulate.report import results_json, summary_text, write_annotations, write_placements

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    config = load_config_file(args.config)
    policies, compare = _policies(args, config)
    mode = Mode(args.mode)
    if mode is Mode.FILL and not args.arrival > 0:
        raise InvalidRequest(f"--arrival: {args.arrival:g} must be a percent > 0 (e.g. 130)")
    for flag, value in (("--placements", args.placements), ("--annotations", args.annotations)):
        if value and not Path(value).resolve().parent.is_dir():
            raise InvalidRequest(f"{flag}: directory {Path(value).resolve().parent} does not exist")
    workload = load_workload(args, config)
    show_progress = not args.no_progress and stderr.isatty()
    results: list[RunResult] = []
    for policy in policies:
        bar = ProgressBar(stderr, policy.label) if show_progress else None
        try:
            results.append(
                run(
                    workload,
                    config=config,
                    policy=policy,
                    mode=mode,
                    arrival=args.arrival,
                    seed=args.seed,
                    placements=bool(args.placements),
                    annotations=bool(args.annotations),
                    progress=bar,
                )
            )
        finally:
            if bar is not None:
                bar.close()
    payload = results_json(results, workload, compare=compare)
    if args.json:
        json.dump(payload, stdout, indent=2)
        stdout.write("\n")
    else:
        stdout.write(summary_text(results, workload) + "\n")
    if args.placements:
        rows = write_placements(args.placements, results)
        if not args.json:
            stdout.write(f"placements: {rows} rows written to {args.placements}\n")
    if args.annotations:
        rows = write_annotations(args.annotations, results)
        if not args.json:
            stdout.write(f"annotations: {rows} pods written to {args.annotations}\n")
    if args.report:
        from hami.simulate.plots import write_report

        paths = write_report(results, args.report)
        (Path(args.report) / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
        if not args.json:
            stdout.write(
                "report: " + ", ".join(str(p) for p in paths) + f", {Path(args.report) / 'summary.json'}\n"
            )
    return 0

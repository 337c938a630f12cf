"""`hami simulate`: the command line of the simulator (arguments, input selection, output).

Kept out of `hami.cli` so the top-level command stays a thin dispatcher and so tests can call
`run_simulate(args)` directly. Every input problem is an `InvalidRequest` (a `TraceError` names file,
line and column); `hami.cli` turns it into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import yaml

from hami.config import CARD_POLICIES, NODE_POLICIES, DeviceConfig, load_config_file
from hami.errors import ApiError, ConfigError, InvalidRequest
from hami.simulate import kubeyaml, openb
from hami.simulate.engine import Mode, Policy, RunResult, parse_policy, run
from hami.simulate.generate import DEFAULT_NODES, DEFAULT_PODS, generate_nodes, generate_pods
from hami.simulate.mixed import VENDOR_NAMES, config_for, generate_mixed, parse_vendor_shares
from hami.simulate.priority import PendingQueue, PriorityReport, assign, check_mode
from hami.simulate.restate import parse_variant, restate
from hami.simulate.start import Placed, begin, split
from hami.simulate.workload import DEFAULT_GPU_MODELS, SimNode, SimPod, Workload, parse_gpu_models

YAML_SUFFIXES = (".yaml", ".yml", ".json")

#: `--arrival` without the flag: the end of the FGD paper's plots.
DEFAULT_ARRIVAL = 130.0

#: Largest `--arrival`: far past the point where a cluster is full (the FGD paper stops at 130 %); a
#: larger target only makes the run longer, and an unbounded one never ends.
MAX_ARRIVAL = 1000.0

#: Largest `--generate` sizes. A fill run grows with the pods placed under binpack/spread (10000 nodes:
#: under a minute on 2 cores) but with nodes x pods under `fragmentation`, and the pods are held in
#: memory (about 3 KiB each), so larger sizes are refused rather than left to run for hours or to
#: exhaust memory.
MAX_GENERATE = (10_000, 200_000)


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
    inputs.add_argument(
        "--from-cluster",
        action="store_true",
        help="the live cluster (read-only LIST of nodes and pods, as hami snapshot) as the nodes, and its own "
        "pods, resampled with --seed, as the workload unless --pods is given",
    )
    inputs.add_argument("--kubeconfig", metavar="FILE",
                        help="with --from-cluster: kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")  # fmt: skip
    inputs.add_argument("--context", metavar="NAME", help="with --from-cluster: kubeconfig context")
    inputs.add_argument("--device-configmap", metavar="NAMESPACE/NAME",
                        help="with --from-cluster and no --config: the scheduler's device ConfigMap (default: the "
                        "chart's, hami-system/hami-scheduler-device, else the one labelled "
                        "app.kubernetes.io/component=device-config, else HAMi's defaults with a warning)")  # fmt: skip
    inputs.add_argument(
        "--from-empty",
        action="store_true",
        help="start from empty cards: the pods already placed in the cluster (or in a YAML pods file) are not "
        "kept in place",
    )
    inputs.add_argument(
        "--restate",
        metavar="VARIANT",
        help="restate the openb pods (CSV or the built-in generator) as HAMi users write requests: hami "
        "(memory MiB, a seeded quarter with cores too), gpumem (memory MiB only), gpumem-cores, "
        "gpumem-percentage; whole cards become nvidia.com/gpu alone (see docs/simulate.md)",
    )
    inputs.add_argument(
        "--vendors",
        metavar="VENDOR=SHARE,...",
        help="built-in mixed-vendor fleet: node shares per vendor, e.g. nvidia=70,ascend=10,cambricon=10,amd=10 "
        "(vendors: " + ", ".join(VENDOR_NAMES) + "; see docs/vendors.md)",
    )
    run_g = p.add_argument_group("replay")
    run_g.add_argument(
        "--mode", choices=[m.value for m in Mode], default=Mode.FILL.value, help="default fill"
    )
    run_g.add_argument(
        "--arrival",
        type=float,
        default=None,
        metavar="PCT",
        help="fill mode only: stop when arrived GPU demand reaches PCT %% of capacity, 0 < PCT <= 1000 "
        "(default 130)",
    )
    run_g.add_argument(
        "--seed", type=int, default=0, help="fill-mode sampling and generator seed (default 0)"
    )
    run_g.add_argument(
        "--priorities",
        metavar="SPEC",
        help="trace mode: pod priorities from the openb qos column (qos, or qos:LS=1000,BE=0) or a drawn "
        "share of high-priority GPU pods (mix:20); default: each pod's spec.priority. Pods that do not "
        "fit wait and are retried when pods leave",
    )
    run_g.add_argument(
        "--preemption",
        choices=["on", "off"],
        help="trace mode: on = a pod that does not fit at its arrival evicts lower-priority pods chosen "
        "by the extender's preempt verb; off = it waits (default off when --priorities is given)",
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
    wif = p.add_argument_group("what-if (how many more pods of one shape fit, per policy)")
    wif.add_argument(
        "--what-if-shape",
        metavar="NAME=QTY,...",
        action="append",
        help="count the pods of this shape that fit from the start state under each policy, e.g. "
        "nvidia.com/gpu=1,nvidia.com/gpumem=8000,nvidia.com/gpucores=30,cpu=4 (names: cpu, memory and the "
        "vendors' resource names; repeat the flag for several shapes)",
    )
    wif.add_argument(
        "--current-policy",
        metavar="POLICY",
        help="with --what-if-shape: the policy the counts are compared with (default: the config's policies)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    out.add_argument("--placements", metavar="FILE.csv", help="write one row per (pod, container, card)")
    out.add_argument(
        "--annotations",
        metavar="FILE.jsonl",
        help="write the extender's annotations of every scheduled GPU pod",
    )
    out.add_argument(
        "--report",
        metavar="DIR",
        help="write PNG plots, the per-node fragmentation and failure-reason CSVs and summary.json into DIR",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    out.add_argument(
        "--progress",
        action="store_true",
        help="progress lines on stderr every 10 %% of each run, also when stderr is not a terminal",
    )


class ProgressLines:
    """One line per `step` (fraction) of a run on any stream: ``binpack: 30 % (4.1 s)``."""

    def __init__(self, stream: TextIO, label: str, step: float = 0.1) -> None:
        self.stream, self.label, self.step = stream, label, step
        self.next = step
        self.started = time.monotonic()

    def __call__(self, done: float) -> None:
        if done + 1e-9 < self.next:
            return
        while self.next <= done + 1e-9:
            self.next += self.step
        self.stream.write(
            f"{self.label}: {min(done, 1.0) * 100:.0f} % ({time.monotonic() - self.started:.1f} s)\n"
        )
        self.stream.flush()

    def close(self) -> None:
        pass


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
    """By suffix, else by the first non-blank line: a CSV header is comma-separated names, while YAML
    starts with a key, `---`, a comment or a directive, and JSON with `{` or `[`."""
    if path.lower().endswith(YAML_SUFFIXES):
        return True
    if path.lower().endswith(".csv"):
        return False
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            head = next((line.strip() for line in f if line.strip()), "")
    except OSError:
        return False
    return ":" in head or head.startswith(("---", "#", "%", "{", "["))


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


def _generate_size(value: str) -> tuple[int, int]:
    n, sep, p = (x.strip() for x in value.partition(","))
    most_n, most_p = MAX_GENERATE
    if (
        not sep
        or not (n.isascii() and n.isdigit() and p.isascii() and p.isdigit())
        or not 1 <= int(n) <= most_n
        or not 1 <= int(p) <= most_p
    ):
        raise InvalidRequest(
            f"--generate: {value!r} must be NODES,PODS with NODES 1..{most_n} and PODS 1..{most_p}, e.g. 200,3000"
        )
    return int(n), int(p)


def _load_config(path: str | None) -> DeviceConfig:
    """The device config, with every error on one line naming the file (and the line for bad YAML)."""
    if path is None:
        return load_config_file(None)
    if not path.strip():
        raise InvalidRequest("--config: empty file name")
    try:
        yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError:
        pass  # load_config_file names the file and the reason
    except UnicodeDecodeError:
        raise InvalidRequest(f"--config {path}: not a UTF-8 text file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise InvalidRequest(f"--config {where}: invalid YAML: {problem}") from None
    try:
        return load_config_file(path)
    except ConfigError as e:
        text = " ".join(str(e).split())
        raise InvalidRequest(
            f"--config {text}" if text.startswith(f"{path}:") else f"--config {path}: {text}"
        ) from None


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


def load_workload(args: argparse.Namespace, config: DeviceConfig) -> tuple[Workload, Placed]:
    """Nodes and pods from the files given (openb CSV or YAML by suffix/content) or the live cluster
    (`--from-cluster`), the generator for the rest; and the pods already placed (`hami.simulate.start`):
    the cluster's with `--from-cluster`, else those of a YAML pods file."""
    for flag, value in (("--nodes", args.nodes), ("--pods", args.pods)):
        if value is not None and not value.strip():
            raise InvalidRequest(f"{flag}: empty file name")
    models = parse_gpu_models(args.gpu_models)
    size_nodes, size_pods = _generate_size(args.generate)
    if not getattr(args, "from_cluster", False):
        for flag, value in (
            ("--kubeconfig", getattr(args, "kubeconfig", None)),
            ("--context", getattr(args, "context", None)),
        ):
            if value is not None:
                raise InvalidRequest(f"{flag}: only with --from-cluster")
    elif args.nodes is not None or getattr(args, "vendors", None):
        raise InvalidRequest(
            "--from-cluster: the cluster is the nodes; drop " + ("--nodes" if args.nodes else "--vendors")
        )
    variant = getattr(args, "restate", None)
    if variant is not None:
        variant = parse_variant(variant)
        if getattr(args, "vendors", None):
            raise InvalidRequest("--restate: not with --vendors (it restates NVIDIA requests of openb pods)")
        if getattr(args, "from_cluster", False) and args.pods is None:
            raise InvalidRequest(
                "--restate: the cluster's pods are already as their users wrote them; give --pods"
            )
        if args.pods is not None and _is_yaml(args.pods):
            raise InvalidRequest(
                f"--restate: {args.pods} is a Kubernetes YAML pod list, already HAMi requests"
            )
    if getattr(args, "vendors", None):
        if args.nodes is not None or args.pods is not None:
            raise InvalidRequest("--vendors: only for the built-in generated fleet; drop --nodes and --pods")
        shares = parse_vendor_shares(args.vendors)
        mixed = generate_mixed(config=config, shares=shares, nodes=size_nodes, pods=size_pods, seed=args.seed)
        return mixed, Placed([])
    nodes: list[SimNode]
    pods: list[SimPod]
    from_cluster: list[SimPod] | None = None
    notes: list[str] = []
    placed = Placed([])
    if getattr(args, "from_cluster", False):
        from hami.simulate.fromcluster import cluster_input

        with_pods = args.pods is None and not getattr(args, "what_if_shape", None)
        got = cluster_input(args, config, with_pods=with_pods)
        nodes, from_cluster, nodes_source, placed = got.nodes, got.pods, got.source, got.placed
        notes.extend(got.skipped)
    elif args.nodes is not None:
        if _is_yaml(args.nodes):
            nodes = kubeyaml.load_nodes(args.nodes, config=config, skipped=notes)
        else:
            nodes = openb.load_nodes(args.nodes, config=config, gpu_models=models)
        nodes_source = args.nodes
    else:
        nodes = generate_nodes(size_nodes, config=config, seed=args.seed)
        nodes_source = f"built-in generator (seed {args.seed}, {size_nodes} nodes)"
    if from_cluster is not None:
        pods = from_cluster
        drawn = f"resampled, seed {args.seed}" if args.mode == Mode.FILL.value else "in time order"
        pods_source = f"{nodes_source} pods ({drawn})"
    elif args.pods is not None:
        if _is_yaml(args.pods):
            in_file, pods = split(kubeyaml.load_pods(args.pods, config=config), config)
            if not getattr(args, "from_cluster", False):
                placed = Placed(in_file, args.pods, in_workload=True)
        else:
            pods = openb.load_pods(args.pods, config=config, gpu_models=models)
        pods_source = args.pods
    else:
        capacity = sum(c.devcore for n in nodes for c in n.cards) / 100
        pods = generate_pods(
            size_pods, config=config, gpu_capacity=max(capacity, 1.0), seed=args.seed, gpu_models=models
        )
        pods_source = f"built-in generator (seed {args.seed}, {size_pods} pods)"
    if variant is not None:
        pods = restate(pods, nodes, variant, config=config, seed=args.seed)
        pods_source = f"{pods_source} restated as {variant} (seed {args.seed})"
    workload = Workload(
        nodes=nodes, pods=pods, nodes_source=nodes_source, pods_source=pods_source, gpu_models=models,
        notes=notes,
    )  # fmt: skip
    return workload, placed


def _check_workload(workload: Workload, mode: Mode) -> None:
    """Inputs that load but cannot be replayed in `mode`, named by their file (the engine checks again)."""
    if not any(n.cards for n in workload.nodes):
        raise InvalidRequest(
            f"{workload.nodes_source}: the cluster has no GPU: no node has a card (openb: the gpu column; "
            "YAML: the hami.io/node-nvidia-register annotation)"
        )
    if not any(c.devcore > 0 for n in workload.nodes for c in n.cards):
        raise InvalidRequest(
            f"{workload.nodes_source}: every card registers devcore 0, so the cluster's GPU capacity "
            "(counted in cores) is 0"
        )
    if mode is Mode.FILL and not any(p.is_gpu for p in workload.pods):
        raise InvalidRequest(
            f"{workload.pods_source}: fill mode needs at least one GPU pod; every pod is CPU-only"
        )
    if mode is Mode.TRACE:
        missing = [p.name for p in workload.pods if p.creation_time is None]
        if missing:
            raise InvalidRequest(
                f"{workload.pods_source}: --mode trace needs a creation time for every pod; {len(missing)} of "
                f"{len(workload.pods)} pods have none (first: {missing[0]}); use --mode fill for pod lists "
                "without times"
            )


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
        config = _load_config(args.config)
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
    _check_workload(replace(workload, pods=[]) if what_if else workload, Mode.TRACE if what_if else mode)
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

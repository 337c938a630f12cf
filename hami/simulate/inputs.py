"""What `hami simulate` replays: the device config, the nodes and pods from files (openb CSV or Kubernetes
YAML), the live cluster or the built-in generators, and the pods already placed.

Every problem is an `InvalidRequest` naming the flag or the file (a `TraceError` names file, line and
column), found before the replay starts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from hami.config import DeviceConfig, load_config_file
from hami.errors import ConfigError, InvalidRequest
from hami.simulate import kubeyaml, openb
from hami.simulate.generate import generate_nodes, generate_pods
from hami.simulate.mixed import generate_mixed, parse_vendor_shares
from hami.simulate.restate import parse_variant, restate
from hami.simulate.results import Mode
from hami.simulate.start import Placed, split
from hami.simulate.workload import SimNode, SimPod, Workload, parse_gpu_models

YAML_SUFFIXES = (".yaml", ".yml", ".json")

#: Largest `--generate` sizes. A fill run grows with the pods placed under binpack/spread (10000 nodes:
#: under a minute on 2 cores) but with nodes x pods under `fragmentation`, and the pods are held in
#: memory (about 3 KiB each), so larger sizes are refused rather than left to run for hours or to
#: exhaust memory.
MAX_GENERATE = (10_000, 200_000)


def is_yaml(path: str) -> bool:
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


def load_config(path: str | None) -> DeviceConfig:
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
        if args.pods is not None and is_yaml(args.pods):
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
        if is_yaml(args.nodes):
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
        if is_yaml(args.pods):
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


def check_workload(workload: Workload, mode: Mode) -> None:
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


__all__ = ("MAX_GENERATE", "YAML_SUFFIXES", "check_workload", "is_yaml", "load_config", "load_workload")

"""The flags of `hami simulate` (documented in docs/simulate.md), in the groups its --help shows."""

from __future__ import annotations

import argparse

from hami.simulate.generate import DEFAULT_NODES, DEFAULT_PODS
from hami.simulate.mixed import VENDOR_NAMES
from hami.simulate.results import Mode
from hami.simulate.workload import DEFAULT_GPU_MODELS


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


__all__ = ("add_arguments",)

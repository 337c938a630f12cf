"""`hami simulate --from-cluster`: the live cluster as the simulator's input, without a file in between.

The nodes and pods come from the same read-only LIST and the same cut-down YAML as `hami snapshot`
(`hami.tools.clusteryaml`), parsed by the same loaders as ``--nodes/--pods`` files
(`hami.simulate.kubeyaml`), so a replay of the live cluster and a replay of its saved snapshot are the
same replay. Nothing is written to the API server.

The workload, unless ``--pods FILE`` gives one, is the cluster's own pods as shapes: each listed pod
(running, pending or finished) with its placement taken off (``spec.nodeName``, ``status`` and every
vendor's allocation annotations, `hami.io/vgpu-node`, `hami.io/vgpu-time`, `hami.io/bind-phase`), so the
fill mode resamples them (``--seed``) onto the cluster's cards as the extender would place them today.
The replay starts from the cluster as it is: the placed pods (`hami.simulate.start`: on a node, not
finished, not being deleted) keep their cards, CPU, memory and pod slots, unless ``--from-empty``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TextIO

from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate import kubeyaml
from hami.simulate.start import Placed, placement_keys, split, unplaced
from hami.simulate.workload import SimNode, SimPod
from hami.tools.clusteryaml import list_cluster, render

#: Where errors and the summary name the input.
SOURCE = "cluster"


@dataclass(frozen=True, slots=True)
class ClusterInput:
    """The live cluster read once: its nodes, its pods as workload shapes (None when the caller gives the
    workload), its placed pods, and the name the summary gives it."""

    nodes: list[SimNode]
    pods: list[SimPod] | None
    placed: Placed
    source: str
    #: Nodes whose registration could not be read (their cards are left out), one line each.
    skipped: tuple[str, ...] = ()


def cluster_input(args: argparse.Namespace, config: DeviceConfig, *, with_pods: bool) -> ClusterInput:
    """The live cluster (`args.kubeconfig`, `args.context`) as the simulator's input.

    Raises `InvalidRequest` for a bad kubeconfig, a cluster without nodes, or one without pods when they
    are the workload (`with_pods`); `hami.errors.ApiError` when the API server cannot be reached
    (reason ``Transport``) or refuses the LIST (401/403).
    """
    listed = list_cluster(args.kubeconfig, args.context)
    context = f" (context {args.context})" if args.context else ""
    source = f"{SOURCE}{context}"
    nodes_text, pods_text = render(listed)
    if not listed.nodes:
        raise InvalidRequest(f"{source}: the API server lists no Node")
    skipped: list[str] = []
    nodes = kubeyaml.load_nodes(f"{source} nodes", config=config, text=nodes_text, skipped=skipped)
    if not listed.pods:
        if with_pods:
            raise InvalidRequest(
                f"{source}: the API server lists no Pod to resample; give the workload with --pods FILE"
            )
        return ClusterInput(nodes, None, Placed([], source), source, tuple(skipped))
    loaded = kubeyaml.load_pods(f"{source} pods", config=config, text=pods_text)
    placed, shapes = split(loaded, config)
    return ClusterInput(
        nodes, shapes if with_pods else None, Placed(placed, source, with_pods), source, tuple(skipped)
    )


def cluster_config(args: argparse.Namespace, stderr: TextIO) -> DeviceConfig:
    """The scheduler's device config read from the cluster (`hami.tools.deviceconfig`: the ConfigMap
    `args.device_configmap`, else the chart's), a warning on `stderr` when HAMi's defaults stand in.

    Raises what `list_cluster` raises, and NotFound for a named ConfigMap that does not exist.
    """
    from hami.kube import KubeClient
    from hami.tools import deviceconfig
    from hami.tools.command import kubeconfig_path

    ref = getattr(args, "device_configmap", None)
    if ref:
        deviceconfig.parse_ref(ref)
    client = KubeClient.from_kubeconfig(kubeconfig_path(args.kubeconfig), context=args.context, timeout_s=10.0,
                                        retries=1, retry_initial_wait_s=0.1, retry_max_wait_s=0.5)  # fmt: skip
    try:
        found = deviceconfig.read(client, ref)
    finally:
        client.close()
    if found.warning:
        stderr.write(f"hami simulate: warning: {found.warning}\n")
    return found.config


def api_error_status(e: BaseException) -> int:
    """Print `e` (an error of the cluster LIST) as `hami inspect` and `hami snapshot` do, one line on
    stderr with a hint, and return their exit status: 3 when the API server cannot be reached, 4 when the
    LIST is forbidden (401/403), 2 for a bad kubeconfig, 1 otherwise."""
    from hami.tools.command import guarded

    def again() -> int:
        raise e

    return guarded(again)


__all__ = (
    "ClusterInput",
    "api_error_status",
    "cluster_config",
    "cluster_input",
    "placement_keys",
    "unplaced",
)

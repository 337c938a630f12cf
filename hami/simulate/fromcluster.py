"""`hami simulate --from-cluster`: the live cluster as the simulator's input, without a file in between.

The nodes and pods come from the same read-only LIST and the same cut-down YAML as `hami snapshot`
(`hami.tools.clusteryaml`), parsed by the same loaders as ``--nodes/--pods`` files
(`hami.simulate.kubeyaml`), so a replay of the live cluster and a replay of its saved snapshot are the
same replay. Nothing is written to the API server.

The workload, unless ``--pods FILE`` gives one, is the cluster's own pods as shapes: each listed pod
(running, pending or finished) with its placement taken off (``spec.nodeName``, ``status`` and every
vendor's allocation annotations, `hami.io/vgpu-node`, `hami.io/vgpu-time`, `hami.io/bind-phase`), so the
fill mode resamples them (``--seed``) onto the cluster's cards as the extender would place them today.
The replay starts from empty cards: the pods' current allocations are not kept in place.
"""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from hami import annotations as A
from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate import kubeyaml
from hami.simulate.workload import SimNode, SimPod
from hami.tools.clusteryaml import list_cluster, render
from hami.vendors import build_vendors

#: Where errors and the summary name the input.
SOURCE = "cluster"


def _placement_keys(config: DeviceConfig) -> set[str]:
    keys = {A.ASSIGNED_NODE, A.ASSIGNED_TIME, A.BIND_PHASE}
    for vendor in build_vendors(config).values():
        keys.update(vendor.allocation_keys())
    return keys


def unplaced(pod: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """`pod` (a `clusteryaml.pod_yaml` object) as a new arrival: no node, no status, no allocation keys."""
    meta = dict(pod.get("metadata") or {})
    annos = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in keys}
    meta["annotations"] = annos
    meta.pop("deletionTimestamp", None)
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {**{k: v for k, v in pod.items() if k != "status"}, "metadata": meta, "spec": spec}


def cluster_input(
    args: argparse.Namespace, config: DeviceConfig, *, with_pods: bool
) -> tuple[list[SimNode], list[SimPod] | None, str]:
    """(nodes, pods or None when `with_pods` is False, source name) of the live cluster.

    Raises `InvalidRequest` for a bad kubeconfig or a cluster without pods (when they are the workload),
    `hami.errors.ApiError` when the API server cannot be reached or refuses the LIST.
    """
    listed = list_cluster(args.kubeconfig, args.context)
    context = f" (context {args.context})" if args.context else ""
    source = f"{SOURCE}{context}"
    nodes_text, pods_text = render(listed)
    if not listed.nodes:
        raise InvalidRequest(f"{source}: the API server lists no Node")
    nodes = kubeyaml.load_nodes(f"{source} nodes", config=config, text=nodes_text)
    if not with_pods:
        return nodes, None, source
    if not listed.pods:
        raise InvalidRequest(
            f"{source}: the API server lists no Pod to resample; give the workload with --pods FILE"
        )
    keys = _placement_keys(config)
    items = yaml.safe_load(pods_text)["items"]
    text = yaml.safe_dump({"kind": "List", "items": [unplaced(p, keys) for p in items]}, sort_keys=False)
    pods = kubeyaml.load_pods(f"{source} pods", config=config, text=text)
    return nodes, pods, source


__all__ = ("cluster_input", "unplaced")

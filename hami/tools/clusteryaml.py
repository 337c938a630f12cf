"""`hami snapshot`: the live cluster saved as the Kubernetes YAML that `hami simulate` reads.

Why: a what-if ("how would policy P pack *my* cluster?") needs the cluster's registrations and its pods'
allocations in a file the simulator already understands (`hami.simulate.kubeyaml`), taken without writing
anything to the API server. The objects come from the one read-only LIST of the operator tools
(`hami.tools.snapshot.read_objects`, through `hami.kube`); each is cut down to what the simulator and the
extender read, so the files hold no secrets, environment or status noise:

* a Node keeps ``metadata`` name, labels and annotations (registrations, handshakes, locks),
  ``spec.unschedulable`` and ``status`` capacity/allocatable;
* a Pod keeps ``metadata`` name, namespace, labels, annotations (HAMi's allocation annotations) and
  creation/deletion times, ``spec`` schedulerName, nodeName, nodeSelector and each container's name and
  resources (init containers with their restartPolicy), and ``status.phase``.

Files written: ``nodes.yaml`` and ``pods.yaml``, each one ``kind: List`` (``hami simulate --nodes DIR/nodes.yaml
--pods DIR/pods.yaml``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hami.errors import InvalidRequest
from hami.tools.snapshot import Listed, read_objects

Obj = dict[str, Any]

NODES_FILE = "nodes.yaml"
PODS_FILE = "pods.yaml"


def _pick(src: Mapping[str, Any] | None, keys: tuple[str, ...]) -> Obj:
    if not isinstance(src, Mapping):
        return {}
    return {k: src[k] for k in keys if src.get(k) not in (None, {}, [])}


def node_yaml(node: Mapping[str, Any]) -> Obj:
    """The parts of a listed Node the simulator reads (see the module docstring)."""
    out: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _pick(node.get("metadata"), ("name", "labels", "annotations")),
    }
    spec = _pick(node.get("spec"), ("unschedulable",))
    if spec:
        out["spec"] = spec
    status = _pick(node.get("status"), ("capacity", "allocatable"))
    if status:
        out["status"] = status
    return out


def _container(c: Any, *, init: bool) -> Obj:
    if not isinstance(c, Mapping):
        return {}
    return _pick(c, ("name", "resources", "restartPolicy") if init else ("name", "resources"))


def pod_yaml(pod: Mapping[str, Any]) -> Obj:
    """The parts of a listed Pod the simulator and the extender read (see the module docstring)."""
    meta = _pick(
        pod.get("metadata"),
        ("name", "namespace", "labels", "annotations", "creationTimestamp", "deletionTimestamp"),
    )
    src = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    spec = _pick(src, ("schedulerName", "nodeName", "nodeSelector", "priority"))
    spec["containers"] = [_container(c, init=False) for c in src.get("containers") or []]
    inits = [_container(c, init=True) for c in src.get("initContainers") or []]
    if inits:
        spec["initContainers"] = inits
    out: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    phase = (pod.get("status") or {}).get("phase") if isinstance(pod.get("status"), Mapping) else None
    if phase:
        out["status"] = {"phase": phase}
    return out


def _as_list(items: list[Obj]) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False)


def render(listed: Listed) -> tuple[str, str]:
    """(nodes.yaml text, pods.yaml text) of `listed`. Pure."""
    nodes = [node_yaml(n) for n in listed.nodes]
    pods = [pod_yaml(p) for p in listed.pods]
    return _as_list(nodes), _as_list(pods)


def list_cluster(kubeconfig: str | None, context: str | None, *, timeout_s: float = 10.0) -> Listed:
    """One read-only LIST of nodes, pods and quotas with the kubeconfig rules of `hami inspect`.

    Raises `InvalidRequest` for a bad kubeconfig or timeout, `hami.errors.ApiError` when the API server
    cannot be reached (reason ``Transport``) or refuses (401/403).
    """
    from hami.kube import KubeClient
    from hami.tools.command import kubeconfig_path

    if not timeout_s > 0:
        raise InvalidRequest(f"--request-timeout {timeout_s:g}: want seconds > 0")
    client = KubeClient.from_kubeconfig(kubeconfig_path(kubeconfig), context=context, timeout_s=timeout_s,
                                        retries=1, retry_initial_wait_s=0.1, retry_max_wait_s=0.5)  # fmt: skip
    try:
        return read_objects(client)
    finally:
        client.close()


def write_snapshot(listed: Listed, out: str | Path) -> tuple[Path, Path]:
    """Write ``nodes.yaml`` and ``pods.yaml`` into `out` (created if missing); returns their paths.

    Raises `InvalidRequest` when `out` is a file or cannot be created.
    """
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise InvalidRequest(f"--out: {out!s} is a file; give a directory (created if missing)")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidRequest(f"--out: cannot create directory {out!s}: {e.strerror}") from None
    nodes_text, pods_text = render(listed)
    paths = (d / NODES_FILE, d / PODS_FILE)
    for path, text in zip(paths, (nodes_text, pods_text), strict=True):
        path.write_text(text, encoding="utf-8")
    return paths


def add_kube_flags(p: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--context``, as `hami inspect` has them."""
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")  # fmt: skip
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current context)")


def add_command(sub: Any) -> None:
    """Register `snapshot` on the `hami` subparsers object."""
    p = sub.add_parser(
        "snapshot",
        help="save the live nodes and pods (read-only) as Kubernetes YAML for hami simulate",
        description="List nodes and pods once (nothing is written to the API server) and save the parts the "
        "simulator reads (registrations, capacity, labels; allocation annotations, phase, node, requests) as "
        "DIR/nodes.yaml and DIR/pods.yaml, for hami simulate --nodes DIR/nodes.yaml --pods DIR/pods.yaml.",
    )
    p.add_argument("--out", metavar="DIR", required=True, help="directory to write into (created if missing)")
    add_kube_flags(p)
    p.add_argument("--request-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="per API request (default: 10)")  # fmt: skip
    p.set_defaults(run=run_snapshot)


def run_snapshot(args: argparse.Namespace) -> int:
    """`hami snapshot`; errors are one line and the exit statuses of `hami inspect`."""
    from hami.tools.command import EXIT_OK, guarded

    def go() -> int:
        if not args.out.strip():
            raise InvalidRequest("--out: empty directory name")
        listed = list_cluster(args.kubeconfig, args.context, timeout_s=args.request_timeout)
        nodes_path, pods_path = write_snapshot(listed, args.out)
        sys.stdout.write(
            f"snapshot: {len(listed.nodes)} nodes to {nodes_path}, {len(listed.pods)} pods to {pods_path}\n"
        )
        return EXIT_OK

    return guarded(go)


__all__ = ("add_command", "list_cluster", "node_yaml", "pod_yaml", "render", "run_snapshot", "write_snapshot")

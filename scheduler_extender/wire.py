"""The kube-scheduler extender wire types (k8s.io/kube-scheduler/extender/v1), parsed and built as plain dicts.

kube-scheduler marshals these structs with Go's encoding/json and the structs carry no json tags, so the
keys it sends are the Go field names (`Pod`, `Nodes`, `NodeNames`, `PodName`, ...; k8s-protocols §1.5).
Go decodes replies case-insensitively; we accept any casing of the top-level keys too (HAMi's docs and
some test clients send `pod` / `nodenames`), and always answer with the exact Go names.

Every parse error is an `InvalidRequest` whose message names the field and what is valid; the server
turns it into the reply's `Error` with HTTP 200, which is what kube-scheduler expects (any other status
is a transport error to it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from hami.errors import InvalidRequest

#: HAMi reads bodies through a 1 MiB limit (§2.3); bigger bodies get an `Error`, not a truncated parse.
MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class FilterArgs:
    """A parsed ExtenderArgs.

    `names`: candidate node names in the order sent, duplicates removed. `node_items`: the full Node
    objects by name when kube-scheduler is not cache-capable (`Nodes`), else None.
    """

    pod: dict[str, Any]
    names: list[str]
    node_items: dict[str, dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class BindArgs:
    """A parsed ExtenderBindingArgs (`PodUID` may be empty: older callers leave it out)."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


#: Bodies with more `[` and `{` than this are decoded by the standard library (see `decode_json`).
_ORJSON_MAX_BRACKETS = 20_000


def _fold(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise InvalidRequest(f"{what}: the body must be a JSON object, got {type(obj).__name__}")
    return {str(k).lower(): v for k, v in obj.items()}


def decode_json(body: bytes, what: str) -> dict[str, Any]:
    """Decode a request body into a dict with lowercased top-level keys. Raises InvalidRequest."""
    if not body.strip():
        raise InvalidRequest(f"{what}: empty body; want a JSON object")
    try:
        # orjson 3.8 recurses without a depth limit and overflows the C stack (the process dies) on a
        # body of ~200,000 nested arrays, well within MAX_BODY_BYTES. Fewer brackets than this cannot
        # nest that deep; a body with more goes to the standard library, which refuses deep nesting.
        if body.count(b"[") + body.count(b"{") > _ORJSON_MAX_BRACKETS:
            raise orjson.JSONDecodeError("many brackets", "", 0)
        # orjson: 4-6x faster on a 485-name ExtenderArgs with its Pod (the extender's hottest decode).
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        # What orjson refuses but JSON allows (integers beyond 64 bits): the standard library decides,
        # and names the problem when it is really not JSON.
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"{what}: body is not valid JSON ({e})") from None
        except RecursionError:
            raise InvalidRequest(f"{what}: body is not a usable request: JSON nested too deeply") from None
    return _fold(obj, what)


def parse_filter_args(body: bytes) -> FilterArgs:
    """Parse ExtenderArgs: `Pod` plus `NodeNames` (nodeCacheCapable true) or `Nodes` (false).

    Raises InvalidRequest for bad JSON, a missing `Pod`/`Pod.metadata.uid`, or no candidate nodes
    (both lists null, missing or empty: kube-scheduler never sends that, so it is a broken caller).
    """
    args = decode_json(body, "ExtenderArgs")
    pod = args.get("pod")
    if not isinstance(pod, dict):
        raise InvalidRequest("ExtenderArgs.Pod: missing or not an object; want the v1.Pod being scheduled")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("uid"), str) or not meta["uid"]:
        raise InvalidRequest("ExtenderArgs.Pod.metadata.uid: missing; want the pod's UID")
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InvalidRequest("ExtenderArgs.Pod.metadata.name: missing; want the pod's name")
    names_raw, nodes_raw = args.get("nodenames"), args.get("nodes")
    node_items: dict[str, dict[str, Any]] | None = None
    if names_raw is not None:
        # C-level checks (map/set/in): a per-name generator was ~2x the decode itself for 485 names.
        if not isinstance(names_raw, list) or not set(map(type, names_raw)) <= {str} or "" in names_raw:
            raise InvalidRequest("ExtenderArgs.NodeNames: want an array of non-empty node names")
        names = list(dict.fromkeys(names_raw))
    elif nodes_raw is not None:
        items = nodes_raw.get("items") if isinstance(nodes_raw, dict) else None
        if not isinstance(items, list):
            raise InvalidRequest('ExtenderArgs.Nodes: want a v1.NodeList {"metadata":{},"items":[...]}')
        node_items = {}
        for i, item in enumerate(items):
            name = ((item or {}).get("metadata") or {}).get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name:
                raise InvalidRequest(f"ExtenderArgs.Nodes.items[{i}].metadata.name: missing")
            node_items.setdefault(name, item)
        names = list(node_items)
    else:
        raise InvalidRequest(
            "ExtenderArgs: NodeNames and Nodes are both missing or null; send NodeNames "
            "(nodeCacheCapable: true) or Nodes (nodeCacheCapable: false)"
        )
    if not names:
        raise InvalidRequest("ExtenderArgs: the candidate node list is empty; nothing to filter")
    return FilterArgs(pod=pod, names=names, node_items=node_items)


def parse_bind_args(body: bytes) -> BindArgs:
    """Parse ExtenderBindingArgs (`PodName`, `PodNamespace`, `PodUID`, `Node`). Raises InvalidRequest."""
    args = decode_json(body, "ExtenderBindingArgs")
    out = {}
    for key, required in (("podname", True), ("podnamespace", True), ("poduid", False), ("node", True)):
        value = args.get(key)
        if value is None and not required:
            value = ""
        if not isinstance(value, str) or (required and not value):
            raise InvalidRequest(
                "ExtenderBindingArgs: PodName, PodNamespace and Node must be non-empty strings "
                f"(PodUID a string); {key!r} is {value!r}"
            )
        out[key] = value
    return BindArgs(out["podname"], out["podnamespace"], out["poduid"], out["node"])


def filter_result(
    args: FilterArgs | None,
    *,
    passed: list[str] | None = None,
    failed: Mapping[str, str] | None = None,
    error: str = "",
) -> dict[str, Any]:
    """An ExtenderFilterResult in the caller's cache mode.

    Cache-capable callers (or unparseable requests) get `NodeNames`; others get `Nodes.items` holding
    the very Node objects they sent. `passed` must be a subset of the request's nodes.
    """
    out: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed) if failed else {},
        "FailedAndUnresolvableNodes": None,
        "Error": error,
    }
    if error:
        out["FailedNodes"] = None
        return out
    passed = passed or []
    if args is not None and args.node_items is not None:
        out["Nodes"] = {"metadata": {}, "items": [args.node_items[n] for n in passed]}
    else:
        out["NodeNames"] = passed
    return out


def bind_result(error: str = "") -> dict[str, str]:
    """An ExtenderBindingResult: `{"Error": ""}` on success."""
    return {"Error": error}


@dataclass(frozen=True, slots=True)
class PreemptArgs:
    """A parsed ExtenderPreemptionArgs.

    `victims`: per candidate node, kube-scheduler's proposed victim UIDs in the order sent (highest
    priority first; empty for a placeholder candidate). `pdb_violations`: its NumPDBViolations per node.
    `pods`: the full victim Pods by UID when kube-scheduler is not cache-capable (`NodeNameToVictims`),
    else None (`NodeNameToMetaVictims` carries UIDs only).
    """

    pod: dict[str, Any]
    victims: dict[str, list[str]]
    pdb_violations: dict[str, int]
    pods: dict[str, dict[str, Any]] | None


def _victims_entry(value: Any, where: str) -> tuple[list[Any], int]:
    if value is None:
        return [], 0  # a node with no proposal yet (a placeholder candidate)
    entry = _fold(value, where) if isinstance(value, dict) else None
    if entry is None:
        raise InvalidRequest(
            f'{where}: want {{"Pods": [...], "NumPDBViolations": n}}, got {type(value).__name__}'
        )
    pods = entry.get("pods")
    if pods is None:
        pods = []
    if not isinstance(pods, list):
        raise InvalidRequest(f"{where}.Pods: want an array")
    n = entry.get("numpdbviolations", 0)
    if n is None:
        n = 0
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InvalidRequest(f"{where}.NumPDBViolations: want a non-negative integer, got {n!r}")
    return pods, n


def parse_preempt_args(body: bytes) -> PreemptArgs:
    """Parse ExtenderPreemptionArgs: `Pod` plus `NodeNameToMetaVictims` (nodeCacheCapable true: UIDs)
    or `NodeNameToVictims` (false: full Pods). Raises InvalidRequest naming the field."""
    args = decode_json(body, "ExtenderPreemptionArgs")
    pod = args.get("pod")
    if not isinstance(pod, dict):
        raise InvalidRequest(
            "ExtenderPreemptionArgs.Pod: missing or not an object; want the v1.Pod being scheduled"
        )
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("uid"), str) or not meta["uid"]:
        raise InvalidRequest("ExtenderPreemptionArgs.Pod.metadata.uid: missing; want the pod's UID")
    meta_raw, full_raw = args.get("nodenametometavictims"), args.get("nodenametovictims")
    raw, full = (meta_raw, False) if meta_raw is not None else (full_raw, True)
    key = "NodeNameToVictims" if full else "NodeNameToMetaVictims"
    if raw is None:
        raise InvalidRequest(
            "ExtenderPreemptionArgs: NodeNameToMetaVictims and NodeNameToVictims are both missing or null; "
            "send NodeNameToMetaVictims (nodeCacheCapable: true) or NodeNameToVictims (false)"
        )
    if not isinstance(raw, dict) or "" in raw:
        raise InvalidRequest(f"ExtenderPreemptionArgs.{key}: want an object of node name -> victims")
    victims: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    pods: dict[str, dict[str, Any]] = {}
    for node, value in raw.items():
        where = f"ExtenderPreemptionArgs.{key}[{node!r}]"
        items, counts[node] = _victims_entry(value, where)
        uids = []
        for i, item in enumerate(items):
            if full:
                m = item.get("metadata") if isinstance(item, dict) else None
                uid = m.get("uid") if isinstance(m, dict) else None
            else:
                uid = _fold(item, f"{where}.Pods[{i}]").get("uid") if isinstance(item, dict) else None
            if not isinstance(uid, str) or not uid:
                field = "metadata.uid" if full else "UID"
                raise InvalidRequest(f"{where}.Pods[{i}].{field}: missing; want the victim pod's UID")
            uids.append(uid)
            if full:
                pods[uid] = item
        victims[node] = uids
    return PreemptArgs(pod=pod, victims=victims, pdb_violations=counts, pods=pods if full else None)


def preempt_result(victims: Mapping[str, tuple[list[str], int]]) -> dict[str, Any]:
    """An ExtenderPreemptionResult: always `NodeNameToMetaVictims` (kube-scheduler reads only that key,
    whatever its cache mode), node -> victim UIDs (highest priority first) and NumPDBViolations. Nodes
    left out are dropped from kube-scheduler's candidates; every node here must have a victim."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": n}
            for node, (uids, n) in victims.items()
        }
    }

"""Loaders for Kubernetes YAML: Node objects carrying HAMi registrations, and Pod manifests.

Why: a cluster exported with `kubectl get nodes -o yaml` (HAMi's device plugin has written
`hami.io/node-nvidia-register` on every GPU node) and the pods of a deployment can be replayed as they
are. Files hold one or more documents (`---`), each a Node, a Pod or a `List` of them. Pods go through
the webhook's per-container mutation (the same `Vendor.mutate_container` the webhook runs), so a bare
`nvidia.com/gpu: 1` means an exclusive card here as in the cluster. Errors name the file, the line of
the object and the field.

Trace times come from `metadata.creationTimestamp` and `metadata.deletionTimestamp` (RFC 3339), as
seconds after the earliest creation in the file; a pod without `creationTimestamp` arrives at time 0.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from hami import pods as podrules
from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.quantity import parse_quantity
from hami.simulate.workload import DEFAULT_MAX_PODS, DEFAULT_NAMESPACE, SimNode, SimPod, TraceError
from hami.vendors import build_vendors

#: CPU / memory of a node that does not state its allocatable: large enough to fit any pod. Also the
#: largest CPU (millicores) or memory (MiB) an object may state: the engine keeps them in int64 arrays.
UNLIMITED = 1 << 50


def _documents(path: str | Path, text: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, object) for every object in the file (or in `text`, named `path`), `List` items expanded."""
    source = str(path)
    try:
        if text is None:
            text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(source, None, f"cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(source, None, "not a UTF-8 text file") from None
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise TraceError(source, line, f"invalid YAML: {problem}") from None
    for node in nodes:
        if node is None:
            continue
        line = node.start_mark.line + 1
        try:
            obj = yaml.SafeLoader("").construct_document(node)
        except yaml.YAMLError as e:
            # e.g. a `!!python/object` tag: the safe loader refuses it.
            mark = getattr(e, "problem_mark", None)
            at = mark.line + 1 if mark is not None else line
            problem = " ".join(str(getattr(e, "problem", None) or e).split())
            raise TraceError(source, at, f"invalid YAML: {problem}") from None
        if obj is None:
            continue
        if not isinstance(obj, dict):
            raise TraceError(source, line, "a document must be a Kubernetes object (a mapping with 'kind')")
        if obj.get("kind") == "List" or (str(obj.get("kind", "")).endswith("List") and "items" in obj):
            items = obj.get("items") or []
            if not isinstance(items, list):
                raise TraceError(source, line, "items: must be a list of objects")
            item_nodes = _item_marks(node)
            for i, item in enumerate(items):
                item_line = item_nodes[i] if i < len(item_nodes) else line
                if not isinstance(item, dict):
                    raise TraceError(source, item_line, f"items[{i}]: must be a Kubernetes object")
                yield item_line, item
        else:
            yield line, obj


def _item_marks(node: yaml.Node) -> list[int]:
    for key, value in getattr(node, "value", []):
        if getattr(key, "value", None) == "items" and isinstance(value, yaml.SequenceNode):
            return [v.start_mark.line + 1 for v in value.value]
    return []


def _quantity(value: Any, *, source: str, line: int, field: str) -> Any:
    try:
        number, _ = parse_quantity(value, resource=field)
    except InvalidRequest as e:
        raise TraceError(source, line, str(e)) from None
    if number < 0:
        raise TraceError(source, line, f"{field}: {value!r} must not be negative")
    return number


def _bounded(value: Any, scale: int | Fraction, *, source: str, line: int, field: str, unit: str) -> int:
    """A quantity times `scale`, rounded up, as an int no larger than `UNLIMITED` (2^50 `unit`)."""
    number = _quantity(value, source=source, line=line, field=field) * scale
    result = int(-(-number // 1))
    if result > UNLIMITED:
        raise TraceError(source, line, f"{field}: {value!r} is larger than 2^50 {unit}")
    return result


def _string_map(value: Any, *, source: str, line: int, field: str) -> dict[str, str]:
    """`metadata.annotations` / `labels`: Kubernetes has them as map[string]string; the core relies on it."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TraceError(source, line, f"{field} must be a mapping of strings to strings")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            hint = f' (quote it in YAML, e.g. "{v}")' if isinstance(v, (int, float, bool)) else ""
            raise TraceError(source, line, f"{field}[{k}]: {v!r} must be a string{hint}")
    return value


def _check_resources(c: Mapping[str, Any], *, source: str, line: int, where: str) -> None:
    """`resources` is a mapping whose `limits`/`requests` map names to quantities (strings or numbers)."""
    res = c.get("resources")
    if res is None:
        return
    if not isinstance(res, dict):
        raise TraceError(source, line, f"{where}: resources must be a mapping (limits, requests)")
    for part in ("limits", "requests"):
        values = res.get(part)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise TraceError(source, line, f"{where}: resources.{part} must be a mapping of quantities")
        for k, v in values.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise TraceError(
                    source, line, f"{where}: resources.{part}[{k}]: {v!r} must be a quantity such as 2 or 8Gi"
                )


def _kind_objects(
    path: str | Path, kind: str, text: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, obj in _documents(path, text):
        if obj.get("kind") == kind:
            yield line, obj


def _name(obj: Mapping[str, Any], *, source: str, line: int, kind: str) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise TraceError(source, line, f"{kind}: metadata.name must be a non-empty string")
    return name


def load_nodes(
    path: str | Path, *, config: DeviceConfig, text: str | None = None, skipped: list[str] | None = None
) -> list[SimNode]:
    """Every `kind: Node` in the file (or in `text`, YAML named `path` in errors). Cards come from the
    inventory of every enabled vendor (registration
    annotations such as `hami.io/node-nvidia-register`, or node capacity such as Cambricon's
    `cambricon.com/mlu.smlu.vcore`); a node without any is a CPU-only node.
    CPU/memory/pods from `status.allocatable`, else `status.capacity`, else unlimited / 110 pods.

    Raises TraceError naming file, line, node and field for a malformed registration or quantity, a
    non-string annotation or label, a `status` that is not a mapping, a duplicate node, bad YAML, or a
    file without any Node. With `skipped` (a list), a malformed vendor inventory is not an error: that
    vendor's cards of the node are left out, as the extender leaves an unreadable registration out, and
    the reason is appended to `skipped`. CPU/memory above 2^50 millicores/MiB are capped there (they fit anything).
    """
    source = str(path)
    vendors = build_vendors(config)
    nodes: list[SimNode] = []
    seen: set[str] = set()
    for line, obj in _kind_objects(path, "Node", text):
        name = _name(obj, source=source, line=line, kind="Node")
        if name in seen:
            raise TraceError(source, line, f"Node {name}: duplicate node name")
        seen.add(name)
        meta = obj["metadata"]
        for part in ("annotations", "labels"):
            _string_map(meta.get(part), source=source, line=line, field=f"Node {name}: metadata.{part}")
        cards = []
        for vendor in vendors.values():
            try:
                found = vendor.node_devices(obj)
            except InvalidRequest as e:
                # Capacity-derived inventories (Cambricon, AWS Neuron, ...) have no registration annotation.
                where = (
                    f"annotation {vendor.register_key}"
                    if vendor.register_key
                    else f"{vendor.common_word} inventory"
                )
                if skipped is None:
                    raise TraceError(source, line, f"Node {name}: {where}: {e}") from None
                skipped.append(f"Node {name}: {where}: {e}; its {vendor.common_word} cards are left out")
                continue
            cards.extend(found or [])
        status = obj.get("status") or {}
        if not isinstance(status, dict):
            raise TraceError(source, line, f"Node {name}: status must be a mapping (allocatable, capacity)")
        part = "allocatable" if status.get("allocatable") else "capacity"
        alloc = status.get(part) or {}
        if not isinstance(alloc, dict):
            raise TraceError(source, line, f"Node {name}: status.{part} must be a mapping of quantities")
        cpu = mem = UNLIMITED
        pods = DEFAULT_MAX_PODS
        where = f"Node {name}: allocatable"
        if "cpu" in alloc:
            cpu = int(_quantity(alloc["cpu"], source=source, line=line, field=f"{where} cpu") * 1000)
        if "memory" in alloc:
            q = _quantity(alloc["memory"], source=source, line=line, field=f"{where} memory")
            mem = int(q / (1 << 20))
        if "pods" in alloc:
            pods = int(_quantity(alloc["pods"], source=source, line=line, field=f"{where} pods"))
        # Larger values mean "fits anything"; capped so that the engine's int64 arrays hold them.
        cpu, mem, pods = min(cpu, UNLIMITED), min(mem, UNLIMITED), min(pods, UNLIMITED)
        nodes.append(
            SimNode(name=name, cpu_milli=cpu, memory_mib=mem, max_pods=pods, obj=obj, cards=tuple(cards))
        )
    if not nodes:
        raise TraceError(source, None, "no object of kind Node")
    return nodes


def _timestamp(value: Any, *, source: str, line: int, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if not isinstance(value, datetime):
        if not isinstance(value, str):
            raise TraceError(source, line, f"{field}: {value!r} is not an RFC 3339 time")
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise TraceError(source, line, f"{field}: {value!r} is not an RFC 3339 time") from None
    # A time without an offset is UTC (as the API server writes it), never this machine's local time.
    return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).timestamp()


def _container_cpu_mem(c: Mapping[str, Any], *, source: str, line: int, where: str) -> tuple[int, int]:
    _check_resources(c, source=source, line=line, where=where)
    res = c.get("resources") or {}
    # kube-scheduler fits requests; a container with only limits gets requests = limits (API defaulting).
    req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    cpu = mem = 0
    if "cpu" in req:
        cpu = _bounded(
            req["cpu"], 1000, source=source, line=line, field=f"{where}: requests.cpu", unit="millicores"
        )
    if "memory" in req:
        mem = _bounded(
            req["memory"],
            Fraction(1, 1 << 20),
            source=source,
            line=line,
            field=f"{where}: requests.memory",
            unit="MiB",
        )
    return cpu, mem


def load_pods(path: str | Path, *, config: DeviceConfig, text: str | None = None) -> list[SimPod]:
    """Every `kind: Pod` in the file (or in `text`, YAML named `path` in errors), mutated as the webhook
    would and ready for the extender's filter.

    CPU/memory = max(sum of app containers and native sidecars, each init container plus the sidecars
    declared before it) of requests (limits when requests are absent), Kubernetes' rule. GPU demand
    (cards, for the fill mode) per device-using container: cards x gpucores/100, else x
    gpumem-percentage/100, else whole cards, combined by the same rule (`hami.pods.peak`), so a pod whose
    cards are in an init container or a sidecar is a GPU pod. Raises TraceError naming file, line, pod, container
    and field for invalid quantities (or CPU/memory above 2^50 millicores/MiB), `resources` not shaped as
    mappings of quantities, non-string annotations or labels, bad times, a duplicate pod, bad YAML, or a
    file without any Pod. Times without a UTC offset are UTC.
    """
    source = str(path)
    vendors = build_vendors(config)
    raw: list[tuple[int, dict[str, Any]]] = list(_kind_objects(path, "Pod", text))
    if not raw:
        raise TraceError(source, None, "no object of kind Pod")
    created: list[float | None] = []
    pods: list[SimPod] = []
    seen: set[tuple[str, str]] = set()
    prepared = []
    for line, original in raw:
        obj = copy.deepcopy(original)
        name = _name(obj, source=source, line=line, kind="Pod")
        meta = obj["metadata"]
        meta.setdefault("namespace", DEFAULT_NAMESPACE)
        if not isinstance(meta["namespace"], str) or not meta["namespace"]:
            raise TraceError(source, line, f"Pod {name}: metadata.namespace must be a non-empty string")
        for part in ("annotations", "labels"):
            _string_map(meta.get(part), source=source, line=line, field=f"Pod {name}: metadata.{part}")
        meta.pop("uid", None)
        key = (meta["namespace"], name)
        if key in seen:
            raise TraceError(source, line, f"Pod {key[0]}/{name}: duplicate pod")
        seen.add(key)
        spec = obj.get("spec")
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("containers"), list)
            or not spec["containers"]
        ):
            raise TraceError(source, line, f"Pod {name}: spec.containers must be a non-empty list")
        inits = spec.get("initContainers") or []
        if not isinstance(inits, list):
            raise TraceError(source, line, f"Pod {name}: spec.initContainers must be a list")
        # Per container (device-list order) its kind, CPU, memory and card demand; the pod needs the
        # peak by the pod rule (init containers one at a time, sidecars beside what follows them).
        per: list[tuple[podrules.ContainerKind, int, int, float]] = []
        for kind, c in podrules.entries(obj):
            if not isinstance(c, dict):
                raise TraceError(source, line, f"Pod {name}: every container must be a mapping")
            where = f"Pod {name}: container {c.get('name', '?')}"
            cpu, mem = _container_cpu_mem(c, source=source, line=line, where=where)
            cards = 0.0
            for vendor in vendors.values():
                try:
                    vendor.mutate_container(c, pod=obj)
                    req = vendor.container_request(c)
                except InvalidRequest as e:
                    raise TraceError(source, line, f"Pod {name}: {e}") from None
                if req is not None:
                    share = req.coresreq if req.coresreq > 0 else None
                    if share is None and req.memreq == 0 and 0 < req.mem_percentage <= 100:
                        share = req.mem_percentage
                    cards += req.nums * (share if share is not None else 100) / 100
            per.append((kind, cpu, mem, cards))
        cpu_peak = int(podrules.peak([(k, cpu) for k, cpu, _, _ in per]))
        mem_peak = int(podrules.peak([(k, mem) for k, _, mem, _ in per]))
        demand = podrules.peak([(k, cards) for k, _, _, cards in per])
        times = (
            _timestamp(
                meta.get("creationTimestamp"),
                source=source,
                line=line,
                field=f"Pod {name}: creationTimestamp",
            ),
            _timestamp(
                meta.get("deletionTimestamp"),
                source=source,
                line=line,
                field=f"Pod {name}: deletionTimestamp",
            ),
        )
        created.append(times[0])
        prepared.append((line, name, obj, cpu_peak, mem_peak, demand, times))
    t0 = min((t for t in created if t is not None), default=0.0)
    for line, name, obj, cpu, mem, demand, (c_t, d_t) in prepared:
        c_rel = (c_t - t0) if c_t is not None else 0.0
        d_rel = (d_t - t0) if d_t is not None else None
        if d_rel is not None and d_rel < c_rel:
            raise TraceError(source, line, f"Pod {name}: deletionTimestamp is before creationTimestamp")
        pods.append(
            SimPod(
                name=name,
                cpu_milli=cpu,
                memory_mib=mem,
                gpu_demand=demand,
                obj=obj,
                creation_time=c_rel,
                deletion_time=d_rel,
            )
        )
    return pods

"""The pod-level rules every component applies the same way: which containers a pod has, in which order,
what kind each is, when a pod or its init containers are done, and what a pod holds on each card.

Why one module: HAMi's per-vendor device lists have one entry per container, init containers first,
then app containers (hami-legacy-spec §1.6.4); the scheduler writes them, the device plugin reads them
back for kubelet's Allocate calls, the cluster cache counts them, the webhook checks the same containers
and the simulator replays them. Each of those used to re-derive "init containers first, one entry per
container"; a native sidecar (an init container with ``restartPolicy: Always``, Kubernetes 1.28+) that
one place forgot would then be counted as an init container by it and as an app container by another.
The rules here are pure functions of the pod's JSON (see `hami.objects` for the fields read).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from hami import objects
from hami.annotations import align_pod_devices
from hami.errors import InvalidRequest
from hami.model import CardGrant, ContainerRequest, PodDevices

#: Pod phases after which a pod holds nothing (Kubernetes PodPhase).
TERMINAL_PHASES = ("Succeeded", "Failed")
#: The pod spec members that hold containers, in device-list order.
CONTAINER_FIELDS = ("initContainers", "containers")


class ContainerKind(StrEnum):
    INIT = "init"
    SIDECAR = "sidecar"  # init container with restartPolicy: Always
    APP = "app"


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container's device requests (one per vendor it asks for)."""

    name: str
    kind: ContainerKind
    requests: tuple[ContainerRequest, ...] = ()


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """An init container with ``restartPolicy: Always`` is a native sidecar: it keeps running beside the
    app containers (Kubernetes 1.28+)."""
    return container.get("restartPolicy") == "Always"


def kind_of(container: Mapping[str, Any], *, init: bool) -> ContainerKind:
    """The kind of a container found in `spec.initContainers` (`init` True) or `spec.containers`."""
    if not init:
        return ContainerKind.APP
    return ContainerKind.SIDECAR if is_sidecar(container) else ContainerKind.INIT


def _list(spec: Mapping[str, Any], field: str) -> list[Any]:
    value = spec.get(field)
    return value if isinstance(value, list) else []


def entries(pod: Mapping[str, Any]) -> Iterator[tuple[ContainerKind, Mapping[str, Any]]]:
    """(kind, container) in device-list order: init containers (and sidecars) first, then app containers.

    Members that are absent, null or not lists count as no containers; entries are yielded as they are
    (callers that take user input check their shape first).
    """
    spec = objects.spec(pod)
    for c in _list(spec, "initContainers"):
        yield (ContainerKind.SIDECAR if is_sidecar(c) else ContainerKind.INIT), c
    for c in _list(spec, "containers"):
        yield ContainerKind.APP, c


def containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every container of the pod in device-list order (init first): entry i of a device list is theirs."""
    spec = objects.spec(pod)
    return [*_list(spec, "initContainers"), *_list(spec, "containers")]


def container_kinds(pod: Mapping[str, Any]) -> list[ContainerKind]:
    """Kinds of a pod's containers in device-list order: init (or sidecar) containers, then app containers."""
    return [k for k, _ in entries(pod)]


def container_names(pod: Mapping[str, Any]) -> list[str]:
    """Names of a pod's containers in device-list order (``""`` for an unnamed one)."""
    return [c.get("name", "") for c in containers(pod)]


def init_count(pod: Mapping[str, Any]) -> int:
    """How many entries of a device list belong to init containers (sidecars included)."""
    return len(_list(objects.spec(pod), "initContainers"))


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """The pod has finished (phase Succeeded or Failed): it holds no device any more."""
    return objects.phase(pod) in TERMINAL_PHASES


def init_done(pod: Mapping[str, Any]) -> bool:
    """All init containers (not native sidecars, which keep running) terminated with exit code 0, so
    their usage can be released (hami-legacy-spec §2.2.2). False for a pod without plain init containers."""
    plain = [c.get("name") for k, c in entries(pod) if k is ContainerKind.INIT]
    if not plain:
        return False
    statuses = {s.get("name"): s for s in objects.status(pod).get("initContainerStatuses") or []}
    for n in plain:
        term = ((statuses.get(n) or {}).get("state") or {}).get("terminated")
        if not term or term.get("exitCode") != 0:
            return False
    return True


def check_container_shape(c: Any, path: str) -> None:
    """Raise InvalidRequest naming the field when a container member the vendor hooks read has the
    wrong JSON type (`path` like ``spec.containers[0]``). The API server's decoder rejects such pods,
    but a request body (ExtenderArgs, an AdmissionReview) must never reach the vendors with them: they
    would fail with an internal error instead of a message."""
    if not isinstance(c, dict):
        raise InvalidRequest(f"{path} must be an object (a container), got {type(c).__name__}")
    res = c.get("resources")
    if res is not None:
        if not isinstance(res, dict):
            raise InvalidRequest(f"{path}.resources must be an object, got {type(res).__name__}")
        for part in ("limits", "requests"):
            value = res.get(part)
            if value is not None and not isinstance(value, dict):
                raise InvalidRequest(
                    f"{path}.resources.{part} must be an object (resource name -> quantity), "
                    f"got {type(value).__name__}"
                )
    env = c.get("env")
    if env is not None:
        if not isinstance(env, list):
            raise InvalidRequest(f"{path}.env must be a list of {{name, value}} objects")
        for j, e in enumerate(env):
            if not isinstance(e, dict):
                raise InvalidRequest(f"{path}.env[{j}] must be an object with name and value")
    ctx = c.get("securityContext")
    if ctx is not None and not isinstance(ctx, dict):
        raise InvalidRequest(f"{path}.securityContext must be an object, got {type(ctx).__name__}")


class RequestReader(Protocol):
    """What the pod rules ask of a vendor (`hami.vendors.base.Vendor`): one container's request.

    A protocol, not the vendor interface: the vendors read pods with these rules, so the rules lie below them.
    """

    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None: ...


def requests(
    pod: Mapping[str, Any], vendors: Mapping[str, RequestReader] | Sequence[RequestReader]
) -> list[ContainerSpec]:
    """Per container (device-list order) its device requests, one per vendor it asks for.

    Raises InvalidRequest (from the vendor) for a bad quantity, naming the container and the field, and
    for a container of the wrong JSON shape (`check_container_shape`).
    """
    vs = list(vendors.values()) if isinstance(vendors, Mapping) else list(vendors)
    spec = objects.spec(pod)
    for field in ("initContainers", "containers"):
        for i, c in enumerate(_list(spec, field)):
            check_container_shape(c, f"spec.{field}[{i}]")
    return [container_spec(c, kind, vs) for kind, c in entries(pod)]


def container_spec(
    container: Mapping[str, Any],
    kind: ContainerKind,
    vendors: Mapping[str, RequestReader] | Sequence[RequestReader],
) -> ContainerSpec:
    """One container's device requests, one per vendor it asks for (in `vendors` order).

    Raises InvalidRequest (from the vendor) for a bad quantity, naming the container and the field.
    """
    vs = vendors.values() if isinstance(vendors, Mapping) else vendors
    reqs = tuple(r for v in vs if (r := v.container_request(container)) is not None)
    return ContainerSpec(name=container.get("name", ""), kind=kind, requests=reqs)


def without_finished_init(devices: PodDevices, kinds: Sequence[ContainerKind]) -> PodDevices:
    """The device lists with the plain init containers' entries emptied (for a pod whose `init_done`):
    finished init containers hold nothing; app and sidecar entries stay."""
    return {
        v: [c if i >= len(kinds) or kinds[i] is not ContainerKind.INIT else [] for i, c in enumerate(lst)]
        for v, lst in devices.items()
    }


def collapse_grants(
    devices: PodDevices, kinds: Sequence[ContainerKind], *, mig_from: PodDevices | None = None
) -> list[CardGrant]:
    """Usage a pod holds per card (§2.2.2 collapse rule, sidecars counted with app containers).

    Per (vendor, uuid): memory/cores = max(largest init container, sum of app + sidecar containers);
    slots = max(1 if only init containers use it, number of app + sidecar containers on it). An init
    container declared after a native sidecar runs alongside it, so its peak includes that sidecar.
    A list written by another HAMi version with fewer or more entries than `kinds` is aligned first
    (`annotations.align_pod_devices`); entries still beyond `kinds` are treated as app containers.

    MIG instances are held until the pod ends, also those of finished init containers (the device plugin
    removes an instance only when its pod is gone): each grant carries the distinct placements of the
    pod's instances on that card, taken from `mig_from` (default `devices`), and a card that only such
    an instance still holds gets a grant of no memory, cores or slots.
    """
    out: list[CardGrant] = []
    placements: dict[tuple[str, str], dict] = {}
    for vendor, per_container in (devices if mig_from is None else mig_from).items():
        for cds in per_container:
            for cd in cds:
                if cd.mig is not None:
                    placements.setdefault((vendor, cd.uuid), {})[cd.mig.placement] = None
    for vendor, per_container in devices.items():
        if kinds and len(per_container) != len(kinds):
            per_container = align_pod_devices(per_container, len(kinds))
        init: dict[str, list[int]] = {}
        app: dict[str, list[int]] = {}
        order: list[str] = []
        for i, cds in enumerate(per_container):
            kind = kinds[i] if i < len(kinds) else ContainerKind.APP
            for cd in cds:
                if cd.uuid not in init and cd.uuid not in app:
                    order.append(cd.uuid)
                if kind is ContainerKind.INIT:
                    # `app` holds only the sidecars declared before this init container: they run with it.
                    side = app.get(cd.uuid, (0, 0, 0))
                    m = init.setdefault(cd.uuid, [0, 0, 0])
                    m[0] = max(m[0], cd.usedmem + side[0])
                    m[1] = max(m[1], cd.usedcores + side[1])
                    m[2] = max(m[2], 1 + side[2])
                else:
                    a = app.setdefault(cd.uuid, [0, 0, 0])
                    a[0] += cd.usedmem
                    a[1] += cd.usedcores
                    a[2] += 1
        missing = Counter(cd.uuid for cds in per_container for cd in cds if cd.mig is None)
        for uuid in order:
            im, ic, islots = init.get(uuid, (0, 0, 0))
            am, ac, an = app.get(uuid, (0, 0, 0))
            out.append(
                CardGrant(
                    uuid=uuid,
                    vendor=vendor,
                    usedmem=max(im, am),
                    usedcores=max(ic, ac),
                    slots=max(an, islots, 1),
                    mig=tuple(placements.pop((vendor, uuid), ())),
                    mig_missing=missing[uuid],
                )
            )
    for (vendor, uuid), held in placements.items():
        out.append(CardGrant(uuid=uuid, vendor=vendor, usedmem=0, usedcores=0, slots=0, mig=tuple(held)))
    return out


def peak(values: Sequence[tuple[ContainerKind, float]]) -> float:
    """What a pod needs at once of an additive resource given per container (device-list order), by the
    same rule as `collapse_grants` (and Kubernetes' effective request with sidecars): the larger of
    (app + sidecar containers summed) and (each init container plus the sidecars declared before it)."""
    running = 0.0  # sidecars started so far, then + app containers
    init_peak = 0.0
    for kind, v in values:
        if kind is ContainerKind.INIT:
            init_peak = max(init_peak, running + v)
        else:
            running += v
    return max(running, init_peak)

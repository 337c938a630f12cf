"""MetaX: whole GPUs (CommonWord `Metax-GPU`, from node capacity) and sGPU shares (`Metax-SGPU`, with QoS).

HAMi pkg/device/metax. Two backends from one `metax:` section:

- Whole GPU: MetaX's `gpu-device` plugin advertises `metax-tech.com/gpu`; cards are derived from the
  capacity (`<node>-metax-<i>`, 1 slot, 65536 MiB as HAMi hard-codes, 100 cores). A request is whole
  cards; HAMi's custom rule holds: several containers of a pod may only share one card (every card given
  to an earlier container must be this card). No node lock (the plugin allocates by kubelet device IDs).
- sGPU: the sGPU plugin registers `metax-tech.com/node-gpu-devices` (JSON with uuid, totalDevCount,
  totalCompute, totalVRam, numa, healthy, qosPolicy, linkZone) and takes the pod that holds
  `hami.io/mutex.lock`, reading `metax-tech.com/gpu-devices-allocated` (per container: uuid, compute,
  vRam MiB). Resources are read from limits only; `metax-tech.com/vmemory` is GiB when bare and bytes
  when it carries a unit (`8Gi` -> 8192 MiB). The webhook validates `metax-tech.com/sgpu-app-class`
  (online/offline, single device) and adds `metax-tech.com/sgpu-qos-policy: best-effort` when absent.
  Per card (HAMi's order): type, health (CardUnhealthy), QoS (an idle card, or a 100-core request, takes
  any QoS; otherwise the card's reported qosPolicy must be empty or the pod's: CardQosPolicyMismatch),
  UUID, slots, mutex, memory, then, for non-online pods, cores without HAMi's usual clamp at 100,
  exclusivity and exhausted compute. Online pods are charged 0 cores.

Whole-GPU nodes are scored as in HAMi from the plugin's node annotations `metax-tech.com/gpu.topology.losses`
(binpack: 2000 - loss of the pod's card count) and `metax-tech.com/gpu.topology.scores` (spread).
Differences from HAMi: an unreadable topology table scores 0 (HAMi reads it as "no loss", the best
score); the sGPU LinkZone topology score and preference, and the app-class co-location check (which
needs the app class of every pod on a card) are not implemented: sGPU cards are chosen by the card
policy; HAMi's in-memory "expected QoS" cache is not kept (the QoS the plugin reports is used).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami.card_checks import core_reason
from hami.errors import AnnotationError, InvalidRequest
from hami.model import PERCENTAGE_UNSET, ContainerDevice, ContainerRequest, Device, DeviceUsage, Selection
from hami.quantity import INT32_MAX, MIB, parse_quantity, to_count
from hami.reason_words import Reason
from hami.vendors import common as C
from hami.vendors.base import AllocationContext, MutationResult, split_list

GPU_MEMORY_MIB = 65536  # HAMi hard-codes the whole card's memory
INVENTORY = "metax-tech.com/node-gpu-devices"
ALLOCATED_JSON = "metax-tech.com/gpu-devices-allocated"
PREDICATE_TIME = "metax-tech.com/predicate-time"
QOS_POLICY = "metax-tech.com/sgpu-qos-policy"
APP_CLASS = "metax-tech.com/sgpu-app-class"
TOPOLOGY_AWARE = "metax-tech.com/sgpu-topology-aware"
TOPOLOGY_LOSSES = "metax-tech.com/gpu.topology.losses"
TOPOLOGY_SCORES = "metax-tech.com/gpu.topology.scores"
QOS_POLICIES = ("best-effort", "fixed-share", "burst-share")
APP_CLASSES = ("online", "offline")


@dataclass(frozen=True)
class MetaxConfig:
    """The `metax:` section (HAMi chart `devices.metax`, pkg/device/metax)."""

    resourceCountName: str = "metax-tech.com/gpu"
    """Whole MetaX GPUs per container (also the node capacity the cards come from). Default `metax-tech.com/gpu`."""
    resourceVCountName: str = "metax-tech.com/sgpu"
    """sGPUs per container (limits only). Default `metax-tech.com/sgpu` (HAMi chart)."""
    resourceVMemoryName: str = "metax-tech.com/vmemory"
    """Per-sGPU memory: a bare number is GiB, a value with a unit is bytes. Default `metax-tech.com/vmemory`."""
    resourceVCoreName: str = "metax-tech.com/vcore"
    """Per-sGPU compute in percent (absent = 100). Default `metax-tech.com/vcore` (HAMi chart)."""
    sgpuTopologyAware: bool = False
    """Default of the pod annotation `metax-tech.com/sgpu-topology-aware`. Default false (HAMi chart); accepted, the LinkZone score is not implemented."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


@dataclass(frozen=True, slots=True)
class MetaxGPUDevice(Device):
    """A whole MetaX GPU with its node's topology tables (device count -> loss / score), None = absent."""

    losses: tuple[tuple[int, int], ...] | None = None
    scores: tuple[tuple[int, int], ...] | None = None


def topology_table(value: str | None) -> tuple[tuple[int, int], ...] | None:
    """`{"1":0,"2":120}` -> ((1, 0), (2, 120)); None when absent or unreadable (then it scores nothing)."""
    if value is None:
        return None
    try:
        raw = A.load_json(value)
        return tuple(sorted((int(k), int(v)) for k, v in raw.items()))  # type: ignore[union-attr]
    except (ValueError, TypeError, AttributeError, AnnotationError):
        return None


@dataclass(frozen=True, slots=True)
class SGPUDevice(Device):
    """An sGPU card with the QoS policy and LinkZone its plugin reports."""

    qos: str = ""
    link_zone: int = 0


@dataclass(frozen=True, slots=True)
class SGPUSelection(Selection):
    qos: str = "best-effort"
    app_class: str = ""


class MetaxGPUVendor(C.ShareVendor):
    common_word = "Metax-GPU"
    to_allocate_key = "hami.io/metax-gpu-devices-to-allocate"
    allocated_key = "hami.io/metax-gpu-devices-allocated"
    custom_fit = True
    scores_nodes = True
    node_annotation_keys = (TOPOLOGY_LOSSES, TOPOLOGY_SCORES)
    whole_card = (0, 100, 100)

    def __init__(self, config: MetaxConfig | None = None) -> None:
        self.config = c = config or MetaxConfig()
        super().__init__(c.resourceCountName)
        self.node_capacity_keys = (c.resourceCountName,)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        annos = A.pod_annotations(node)
        losses, scores = (
            topology_table(annos.get(TOPOLOGY_LOSSES)),
            topology_table(annos.get(TOPOLOGY_SCORES)),
        )
        return C.capacity_cards(node, self._names.count, lambda name, i, _: MetaxGPUDevice(
            uuid=f"{name}-metax-{i}", index=i, count=1, devmem=GPU_MEMORY_MIB, devcore=100,
            type=self.common_word, vendor=self.common_word, losses=losses, scores=scores,
        ))  # fmt: skip

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        return C.same_card_fit(
            self, req, cards, usage, selection=selection, policy=policy, earlier=earlier, quota_ok=quota_ok
        )

    def node_score(self, containers, *, cards, node_policy):  # noqa: ANN001, ANN201
        """HAMi: 2000 - loss (binpack) or 2000 - score (spread) of the pod's device count, from the node's
        topology tables; 0 without a table. A count missing from a table costs nothing (HAMi)."""
        n = sum(len(c) for c in containers)
        first = next((cards.get(cd.uuid) for c in containers for cd in c), None)
        if n == 0 or not isinstance(first, MetaxGPUDevice):
            return 0.0
        table = (
            first.losses if node_policy == "binpack" else first.scores if node_policy == "spread" else None
        )
        if table is None:
            return 0.0
        return 2000.0 - dict(table).get(n, 0)


def sgpu_memory_mib(value: Any, *, resource: str) -> int:
    """`metax-tech.com/vmemory` in MiB: bare = GiB, any letter = bytes (floored to MiB). Raises InvalidRequest."""
    v, _ = parse_quantity(value, resource=resource)
    text = str(value).strip()
    if v < 0 or v.denominator != 1:
        raise InvalidRequest(f"{resource}: {value!r} must be a whole number of GiB (or bytes with a unit)")
    mib = int(v // MIB) if any(ch.isalpha() for ch in text) else int(v * 1024)
    if mib > INT32_MAX:
        raise InvalidRequest(f"{resource}: {value!r} is larger than {INT32_MAX} MiB")
    return mib


class MetaxSGPUVendor(C.ShareVendor):
    common_word = "Metax-SGPU"
    register_key = INVENTORY
    to_allocate_key = "hami.io/metax-sgpu-devices-to-allocate"
    allocated_key = "hami.io/metax-sgpu-devices-allocated"
    use_uuid_key = "metax-tech.com/use-gpuuuid"
    nouse_uuid_key = "metax-tech.com/nouse-gpuuuid"
    uses_node_lock = True
    custom_fit = True
    quota_memory_factor = 1024

    def __init__(self, config: MetaxConfig | None = None) -> None:
        self.config = c = config or MetaxConfig()
        super().__init__(c.resourceVCountName, c.resourceVMemoryName, c.resourceVCoreName)

    def user_annotation_keys(self) -> tuple[str, ...]:
        return (*super().user_annotation_keys(), QOS_POLICY, APP_CLASS, TOPOLOGY_AWARE)

    def allocation_keys(self) -> tuple[str, ...]:
        return (self.to_allocate_key, self.allocated_key, ALLOCATED_JSON, PREDICATE_TIME)

    def read_limits(self, container: Mapping[str, Any]) -> dict[str, Any]:
        return C.limits_only(container)

    @C.gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        n = self._names
        limits = C.limits_only(container)
        nums = C.asked_count(container, limits, n.count)
        if nums is None:
            return None
        mem = 0
        if n.memory in limits:
            mem = sgpu_memory_mib(limits[n.memory], resource=C.field_name(container, n.memory))
        cores = 100
        if n.cores in limits:
            cores = to_count(limits[n.cores], resource=C.field_name(container, n.cores), unit="percent")
        return ContainerRequest(self.common_word, nums, mem, 100 if mem == 0 else PERCENTAGE_UNSET, cores)

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return SGPUSelection(
            use_uuids=split_list(annotations.get(self.use_uuid_key), field=self.use_uuid_key),
            nouse_uuids=split_list(annotations.get(self.nouse_uuid_key), field=self.nouse_uuid_key),
            qos=(annotations.get(QOS_POLICY) or "best-effort").strip(),
            app_class=(annotations.get(APP_CLASS) or "").strip(),
        )

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        """Cards from `metax-tech.com/node-gpu-devices`; Index = position. Raises AnnotationError."""
        value = A.pod_annotations(node).get(INVENTORY)
        if value is None:
            return None
        raw = A.load_json(value)
        if not isinstance(raw, list):
            raise AnnotationError("must be a JSON array of devices")
        out: list[Device] = []
        for i, d in enumerate(raw):
            if not isinstance(d, dict) or not isinstance(d.get("uuid"), str) or not d["uuid"]:
                raise AnnotationError(f"device {i}: must be an object with a non-empty 'uuid'")
            A.check_card_id(d["uuid"], f"device {i}")
            nums = {}
            for k in ("totalDevCount", "totalCompute", "totalVRam", "numa", "linkZone"):
                v = d.get(k, 0)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise AnnotationError(
                        f"device {i} ({d['uuid']}): field {k!r} must be an integer >= 0, got {v!r}"
                    )
                nums[k] = v
            out.append(
                SGPUDevice(
                    uuid=d["uuid"],
                    index=i,
                    count=nums["totalDevCount"],
                    devmem=nums["totalVRam"],
                    devcore=nums["totalCompute"],
                    type=self.common_word,
                    numa=nums["numa"],
                    health=d.get("healthy") is True,
                    vendor=self.common_word,
                    qos=str(d.get("qosPolicy") or ""),
                    link_zone=nums["linkZone"],
                )  # fmt: skip
            )
        return out

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        sel = selection if isinstance(selection, SGPUSelection) else SGPUSelection()
        online = sel.app_class == "online"

        def qos(d: Device, u: DeviceUsage) -> Reason | None:
            clash = (
                not online
                and u.used > 0
                and req.coresreq != 100
                and getattr(d, "qos", "") not in ("", sel.qos)
            )
            return Reason.CARD_QOS_POLICY_MISMATCH if clash else None

        def cores(d: Device, u: DeviceUsage) -> Reason | None:
            return None if online else core_reason(d.devcore, u.usedcores, u.used, req.coresreq)

        passing, reasons = C.scan(
            cards, usage, selection=sel, mutex=policy.mutex, mem=req.memory_on, cores=cores, first=qos,
            unhealthy=Reason.CARD_UNHEALTHY,
        )  # fmt: skip
        used_cores = 0 if online else req.coresreq
        return C.choose(
            passing, reasons, req, policy, lambda d, _: C.take(d, req, req.memory_on(d), used_cores)
        )

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        out = super().allocation_annotations(containers, context=context)
        per = []
        for c in containers:
            entries = []
            for cd in c:
                e: dict[str, Any] = {"uuid": cd.uuid}
                if cd.usedcores:
                    e["compute"] = cd.usedcores
                if cd.usedmem:
                    e["vRam"] = cd.usedmem
                entries.append(e)
            per.append(entries)
        out[ALLOCATED_JSON] = json.dumps(per, separators=(",", ":"))
        out[PREDICATE_TIME] = C.unix_ns(context)
        return out

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """HAMi's sGPU admission: app-class must be online/offline and single-device; non-online pods
        get `sgpu-qos-policy: best-effort` when absent, and a present policy must be a known one."""
        n = self._names
        if not C.in_limits(container, n.count):
            return MutationResult()
        req = self.container_request(container)
        annos = pod.setdefault("metadata", {}).setdefault("annotations", {})
        app_class = annos.get(APP_CLASS)
        if app_class is not None:
            if app_class not in APP_CLASSES:
                raise InvalidRequest(f"{APP_CLASS} must be set one of [online, offline]")
            if req is not None and req.nums != 1:
                raise InvalidRequest("app-class pod must request single device")
        if app_class != "online":
            qos = annos.get(QOS_POLICY)
            if qos is None:
                annos[QOS_POLICY] = "best-effort"
            elif qos not in QOS_POLICIES:
                raise InvalidRequest(
                    f"{QOS_POLICY} must be set one of [best-effort, fixed-share, burst-share]"
                )
        return MutationResult(uses_device=True)


def build(config: MetaxConfig, device_config: Any) -> list[Any]:
    return [MetaxGPUVendor(config), MetaxSGPUVendor(config)]

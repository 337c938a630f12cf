"""AWS Neuron (CommonWord `AWSNeuron`): whole Neuron devices or NeuronCores, from node capacity.

HAMi pkg/device/awsneuron. AWS's neuron device plugin advertises `aws.amazon.com/neuron` (devices) and
`aws.amazon.com/neuroncore` (cores); each device becomes `<node>-AWSNeuron-<i>` with as many slots as it
has cores and its cores as a bitmask (`devcore` 3 = two cores). `neuron: N` takes N whole devices;
`neuroncore: K` takes one device's core (K = 1) or K/2 whole devices (K even; any other K is rejected).
Several devices must be contiguous: on `inf*` instances any run of free devices, otherwise runs aligned
to their size (2, 4, 8 or 16). One core takes the free bit of a device (the first fitting device in
card-policy order). The plugin (AWS's neuron-scheduler-extension protocol) picks the pod with
`NEURON_ALLOCATED=false` and the oldest `NEURON_ALLOC_TIME` and exposes `AWS_NEURON_IDS` (device
indexes for `neuron` containers, core indexes `2 x index + bit` otherwise, over all containers); no
node lock. Quota on `aws.amazon.com/neuroncore` counts the core bitmasks, as HAMi does.

Differences from HAMi: cores per device are taken per node (HAMi caches the first node's figure for
the process); 2-device runs fit on non-`inf` nodes (HAMi handles only 4, 8 and 16 there, so `neuron: 2`
never fits); a `neuroncore`-only container marks the pod as ours in the webhook (HAMi does not, and such
a pod is then scheduled without an allocation).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami import objects
from hami.errors import InvalidRequest
from hami.model import ContainerDevice, ContainerRequest, Device, DeviceUsage
from hami.quantity import parse_quantity
from hami.reason_words import Reason
from hami.vendors import common as C
from hami.vendors.base import AllocationContext, MutationResult, ResourceNames, container_limits, labels

INSTANCE_TYPE = "node.kubernetes.io/instance-type"
IDS = "AWS_NEURON_IDS"
RESOURCE_TYPE = "NEURON_RESOURCE_TYPE"
ALLOC_TIME = "NEURON_ALLOC_TIME"
ALLOCATED = "NEURON_ALLOCATED"
PREDICATE_NODE = "aws.amazon.com/predicate-node"
CORES_PER_DEVICE = 2  # HAMi caps the observed figure at 2 when splitting a core request


@dataclass(frozen=True)
class AWSNeuronConfig:
    """The `awsneuron:` section (HAMi chart `devices.awsneuron`, pkg/device/awsneuron)."""

    resourceCountName: str = "aws.amazon.com/neuron"
    """Whole Neuron devices per container (also node capacity). Default `aws.amazon.com/neuron` (HAMi chart)."""
    resourceCoreName: str = "aws.amazon.com/neuroncore"
    """NeuronCores per container: 1, or a multiple of 2 (whole devices); also node capacity. Default `aws.amazon.com/neuroncore`."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


@dataclass(frozen=True, slots=True)
class NeuronDevice(Device):
    instance_type: str = ""


def _positive(value: Any, resource: str) -> int:
    v, _ = parse_quantity(value, resource=resource)
    if v.denominator != 1:
        raise InvalidRequest(f"{resource} must be an integer")
    if v <= 0:
        raise InvalidRequest(f"{resource} must be greater than 0")
    return int(v)


def _bits(mask: int) -> list[int]:
    return [b for b in range(mask.bit_length()) if mask >> b & 1]


class AWSNeuronVendor(C.ShareVendor):
    common_word = "AWSNeuron"
    allocated_key = "hami.io/aws-neuron-devices-allocated"
    use_uuid_key = "aws.amazon.com/use-neuron-uuid"
    nouse_uuid_key = "aws.amazon.com/nouse-neuron-uuid"
    custom_fit = True
    node_label_keys = (INSTANCE_TYPE,)

    def __init__(self, config: AWSNeuronConfig | None = None) -> None:
        self.config = c = config or AWSNeuronConfig()
        super().__init__(c.resourceCountName)
        self._names = ResourceNames(count=c.resourceCountName, cores=c.resourceCoreName)
        self.gate_keys = (c.resourceCountName, c.resourceCoreName)
        self.node_capacity_keys = (c.resourceCountName, c.resourceCoreName)

    def allocation_keys(self) -> tuple[str, ...]:
        return (self.allocated_key, IDS, RESOURCE_TYPE, ALLOC_TIME, ALLOCATED, PREDICATE_NODE)

    @C.gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        """`neuron: N` -> N devices x all cores; `neuroncore: K` -> 1 device x K (K <= 2) or K/2 devices."""
        n = self._names
        limits = container_limits(container)
        if n.count in limits:
            nums = _positive(limits[n.count], n.count)
            return ContainerRequest(self.common_word, nums, 0, 100, CORES_PER_DEVICE)
        if n.cores in limits:
            cores = _positive(limits[n.cores], n.cores)
            if cores <= CORES_PER_DEVICE:
                return ContainerRequest(self.common_word, 1, 0, 100, cores)
            if cores % CORES_PER_DEVICE:
                raise InvalidRequest(f"{n.cores} must be 1 or a multiple of {CORES_PER_DEVICE}, got {cores}")
            return ContainerRequest(self.common_word, cores // CORES_PER_DEVICE, 0, 100, CORES_PER_DEVICE)
        return None

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        return MutationResult(uses_device=self.container_request(container) is not None)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        n = C.capacity_count(node, self._names.count)
        if n is None:
            return None
        cores = C.capacity_count(node, self._names.cores, unit="NeuronCores") or 0
        per = cores // n if n else 0
        name = objects.name(node)
        itype = labels(node).get(INSTANCE_TYPE, "")
        return [
            NeuronDevice(uuid=f"{name}-AWSNeuron-{i}", index=i, count=per, devmem=0, devcore=(1 << per) - 1,
                         type=self.common_word, vendor=self.common_word, instance_type=itype)
            for i in range(n)
        ]  # fmt: skip

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        if req.nums > 1:
            return self._runs(req, cards, usage, selection)

        def cores(d: Device, u: DeviceUsage) -> Reason | None:
            short = len(_bits(d.devcore)) - len(_bits(u.usedcores)) < req.coresreq
            return Reason.CARD_INSUFFICIENT_CORE if short else None

        def device(d: Device, u: DeviceUsage) -> ContainerDevice:
            """The card with the lowest `req.coresreq` of its free cores, as a bit mask."""
            free = [b for b in _bits(d.devcore) if not u.usedcores >> b & 1]
            return C.take(d, req, 0, sum(1 << b for b in free[: req.coresreq]))

        passing, reasons = C.scan(cards, usage, selection=selection, mutex=policy.mutex, cores=cores)
        return C.choose(passing, reasons, req, policy, device)

    def _runs(self, req, cards, usage, selection):  # noqa: ANN001, ANN202
        by_index = sorted(cards, key=lambda d: d.index)
        ok = [d.health and usage(d.uuid).used == 0 and C.uuid_ok(d, selection) for d in by_index]
        inf = any("inf" in getattr(d, "instance_type", "").lower() for d in by_index)
        n = req.nums
        starts = range(0, len(by_index) - n + 1) if inf else range(0, len(by_index) - n + 1, n)
        if inf or n in (2, 4, 8, 16):
            for s in starts:
                if all(ok[s : s + n]):
                    return [C.take(d, req, 0, d.devcore) for d in by_index[s : s + n]], Counter()
        return None, Counter({Reason.NUMA_NOT_FIT: 1})

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        cards = context.cards if context else {}
        pod = context.pod if context else {}
        spec = pod.get("spec") or {}
        ctrs = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        ids: list[str] = []
        core_ids = False
        for i, c in enumerate(containers):
            if not c:
                continue
            whole = i < len(ctrs) and self._names.count in (
                (ctrs[i].get("resources") or {}).get("limits") or {}
            )
            for cd in c:
                d = cards.get(cd.uuid)
                idx = d.index if d else 0
                if whole:
                    ids.append(str(idx))
                else:
                    per = d.count if d else CORES_PER_DEVICE
                    ids.extend(str(per * idx + b) for b in _bits(cd.usedcores))
                    core_ids = True
        out = {
            self.allocated_key: A.encode_pod_devices(containers),
            IDS: ",".join(ids),
            ALLOC_TIME: C.unix_ns(context),
            ALLOCATED: "false",
            PREDICATE_NODE: context.node if context else "",
        }
        if core_ids:
            out[RESOURCE_TYPE] = self._names.cores or ""
        return out


def build(config: AWSNeuronConfig, device_config: Any) -> list[AWSNeuronVendor]:
    return [AWSNeuronVendor(config)]

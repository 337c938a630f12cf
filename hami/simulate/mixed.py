"""The built-in mixed-vendor fleet: NVIDIA nodes shaped like the openb trace next to 8-card nodes of
other vendors, in the shares an operator asks for (`hami simulate --vendors nvidia=70,ascend=10,...`).

Why: an operator with Ascend, Cambricon or AMD nodes wants to see how a fleet packs before moving to
this scheduler, without a cluster. Every node carries its vendor's real inventory (registration
annotation or node capacity, as its device plugin publishes it), and every pod asks for the vendor's
resources with its units, so the replay goes through the same vendor code as the extender.

The pod mix is the openb request mix (whole cards, fractional shares, multi-card pods); a pod's vendor
is drawn in proportion to the vendors' card counts. A share of a card becomes the vendor's compute share
and a matching memory share (Moore Threads: the next legal memory size; whole-card-only vendors round
up to whole cards). A pod's `gpu_demand` is in the engine's capacity unit (card devcore / 100), so the
fill mode's arrival percentage means the same for every vendor. Ascend nodes run HAMi's soft split
(`hami-vnpu-core`), so their pods are charged compute like the others. Same seed, same fleet.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate.generate import MEAN_INTERARRIVAL_S, POD_SHAPES, generate_nodes, generate_pods
from hami.simulate.workload import (
    DEFAULT_MAX_PODS,
    DEFAULT_NAMESPACE,
    OPENB_CONTAINER,
    SimNode,
    SimPod,
    Workload,
)
from hami.vendors import build_vendors

CARDS = 8
NODE_CPU_MILLI = 96000
NODE_MEMORY_MIB = 786432
MTHREADS_UNITS = (2, 4, 8, 16, 32, 64, 96)


@dataclass(frozen=True)
class VendorShape:
    """How one vendor's nodes and pods look: `inventory(name)` -> (annotations, capacity); `limits(n, pct)`
    -> (container limits, pod annotations) for `n` cards at `pct` percent of a card's compute;
    `unit` = one card's capacity in the engine's unit (devcore / 100); `whole_only`: shares become cards;
    `counts`: the card counts a request may have (None = any)."""

    inventory: Callable[[str], tuple[dict[str, str], dict[str, str]]]
    limits: Callable[[int, int], tuple[dict[str, str], dict[str, str]]]
    unit: float
    whole_only: bool = False
    counts: tuple[int, ...] | None = None


def _json(devs: list[dict[str, Any]]) -> str:
    return json.dumps(devs, separators=(",", ":"))


def _ascend(name: str) -> tuple[dict[str, str], dict[str, str]]:
    devs = [{"id": f"{name}-npu-{i}", "index": i, "count": 7, "devmem": 65536, "devcore": 100, "type": "Ascend910B3",
             "health": True, "custominfo": {"NetworkID": i // 4}} for i in range(CARDS)]  # fmt: skip
    return {"hami.io/node-register-Ascend910B3": _json(devs), "hami-vnpu-core": "true"}, {}


def _ascend_limits(n: int, pct: int) -> tuple[dict[str, str], dict[str, str]]:
    lim = {"huawei.com/Ascend910B3": str(n), "huawei.com/Ascend910B3-core": str(pct)}
    if pct < 100:
        lim["huawei.com/Ascend910B3-memory"] = str(65536 * pct // 100)
    return lim, {"huawei.com/vnpu-mode": "hami-core"}


def _hygon(name: str) -> tuple[dict[str, str], dict[str, str]]:
    devs = "".join(
        f"{name}-dcu-{i},4,65520,100,DCU-K100_AI,{i // 4},true,{i},hami-core:" for i in range(CARDS)
    )
    return {"hami.io/node-dcu-register": devs}, {}


def _iluvatar(name: str) -> tuple[dict[str, str], dict[str, str]]:
    devs = "".join(f"{name}-ilu-{i},16,32768,100,BI-V150,{i // 4},true,{i},hami-core:" for i in range(CARDS))
    return {"hami.io/node-BI-V150-register": devs}, {}


def _amd(name: str) -> tuple[dict[str, str], dict[str, str]]:
    devs = [{"id": f"{name}-amd-{i}", "index": i, "count": 10, "devmem": 196288, "devcore": 304,
             "type": "AMD Instinct MI300X", "numa": i // 4, "health": True} for i in range(CARDS)]  # fmt: skip
    return {"hami.io/node-amd-register": _json(devs)}, {}


def _share(count: str, mem: str | None, mem_total: int, cores: str, core_total: int = 100):  # noqa: ANN202
    def limits(n: int, pct: int) -> tuple[dict[str, str], dict[str, str]]:
        lim = {count: str(n), cores: str(max(1, math.ceil(core_total * pct / 100)))}
        if mem and pct < 100:
            lim[mem] = str(max(1, mem_total * pct // 100))
        return lim, {}

    return limits


def _mthreads_limits(n: int, pct: int) -> tuple[dict[str, str], dict[str, str]]:
    if n > 1 or pct >= 100:
        return {
            "mthreads.com/vgpu": str(n),
            "mthreads.com/sgpu-core": str(16 * n),
            "mthreads.com/sgpu-memory": str(96 * n),
        }, {}
    units = next(u for u in MTHREADS_UNITS if u >= 96 * pct / 100)
    return {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-core": str(max(1, math.ceil(16 * pct / 100))),
            "mthreads.com/sgpu-memory": str(units)}, {}  # fmt: skip


def _whole(resource: str) -> Callable[[int, int], tuple[dict[str, str], dict[str, str]]]:
    return lambda n, pct: ({resource: str(n)}, {})


def _capacity(**cap: str) -> Callable[[str], tuple[dict[str, str], dict[str, str]]]:
    return lambda name: ({}, dict(cap))


#: Vendor name (as in `--vendors`) -> its shape. NVIDIA nodes come from the openb generator.
SHAPES: dict[str, VendorShape] = {
    "ascend": VendorShape(_ascend, _ascend_limits, 1.0),
    "cambricon": VendorShape(
        _capacity(**{"cambricon.com/mlu.smlu.vcore": str(100 * CARDS), "cambricon.com/mlu.smlu.vmemory": str(96 * CARDS)}),
        _share("cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", 96, "cambricon.com/mlu.smlu.vcore"), 1.0,
    ),
    "hygon": VendorShape(_hygon, _share("hygon.com/dcunum", "hygon.com/dcumem", 65520, "hygon.com/dcucores"), 1.0),
    "iluvatar": VendorShape(
        _iluvatar, _share("iluvatar.ai/BI-V150-vgpu", "iluvatar.ai/BI-V150.vMem", 128, "iluvatar.ai/BI-V150.vCore"), 1.0
    ),
    "amd": VendorShape(_amd, _share("amd.com/gpu", "amd.com/gpumem", 196288, "amd.com/gpucores"), 3.04),
    "mthreads": VendorShape(
        _capacity(**{"mthreads.com/sgpu-core": str(16 * CARDS), "mthreads.com/sgpu-memory": str(96 * CARDS)}),
        _mthreads_limits, 0.16,
    ),
    "metax": VendorShape(_capacity(**{"metax-tech.com/gpu": str(CARDS)}), _whole("metax-tech.com/gpu"), 1.0, whole_only=True),
    "enflame": VendorShape(_capacity(**{"enflame.com/gcu": str(CARDS)}), _whole("enflame.com/gcu"), 1.0, whole_only=True),
    "kunlun": VendorShape(
        _capacity(**{"kunlunxin.com/xpu": str(CARDS)}), _whole("kunlunxin.com/xpu"), 1.0, whole_only=True, counts=(1, 2, 4, 8)
    ),
}  # fmt: skip
VENDOR_NAMES = ("nvidia", *SHAPES)


def parse_vendor_shares(value: str) -> dict[str, float]:
    """`nvidia=70,ascend=10,...` -> {vendor: fraction of nodes}. Raises InvalidRequest naming the entry."""
    out: dict[str, float] = {}
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        name, _, num = entry.partition("=")
        name = name.strip().lower()
        if name not in VENDOR_NAMES:
            raise InvalidRequest(
                f"--vendors: unknown vendor {name!r} in {entry!r}; valid: {', '.join(VENDOR_NAMES)}"
            )
        try:
            share = float(num)
        except ValueError:
            share = -1.0
        if not share > 0 or not math.isfinite(share):
            raise InvalidRequest(f"--vendors: {entry!r} needs a share > 0, e.g. {name}=10")
        out[name] = out.get(name, 0.0) + share
    if not out:
        raise InvalidRequest("--vendors: give at least one VENDOR=SHARE, e.g. nvidia=70,ascend=30")
    total = sum(out.values())
    return {k: v / total for k, v in out.items()}


def config_for(config: DeviceConfig, shares: Mapping[str, float]) -> DeviceConfig:
    """`config` with the switched vendors (Ascend, Iluvatar) enabled when the fleet has them."""
    from dataclasses import replace

    s = config.scheduler
    return replace(
        config,
        scheduler=replace(s, enableAscend=s.enableAscend or "ascend" in shares,
                          enableIluvatar=s.enableIluvatar or "iluvatar" in shares),
    )  # fmt: skip


def _vendor_node(vendor: str, name: str, config: DeviceConfig) -> SimNode:
    annotations, capacity = SHAPES[vendor].inventory(name)
    alloc = {
        "cpu": f"{NODE_CPU_MILLI}m",
        "memory": f"{NODE_MEMORY_MIB}Mi",
        "pods": str(DEFAULT_MAX_PODS),
        **capacity,
    }
    obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": annotations},
           "status": {"capacity": dict(alloc), "allocatable": alloc}}  # fmt: skip
    cards = [d for v in build_vendors(config).values() for d in (v.node_devices(obj) or [])]
    return SimNode(name, NODE_CPU_MILLI, NODE_MEMORY_MIB, DEFAULT_MAX_PODS, obj, tuple(cards))


def generate_mixed(
    *, config: DeviceConfig, shares: Mapping[str, float], nodes: int, pods: int, seed: int = 0
) -> Workload:
    """`nodes` nodes split by `shares` (fractions, see `parse_vendor_shares`) and `pods` pods.

    `config` must enable the vendors used (`config_for`). Deterministic for `seed`.
    """
    counts = {v: int(round(f * nodes)) for v, f in shares.items()}
    biggest = max(counts, key=lambda v: counts[v])
    counts[biggest] += nodes - sum(counts.values())
    node_list: list[SimNode] = []
    capacity = {v: 0.0 for v in counts}  # engine units (devcore / 100)
    cards = {v: 0 for v in counts}
    for vendor, k in counts.items():
        if vendor == "nvidia":
            built = generate_nodes(k, config=config, seed=seed) if k > 0 else []
        else:
            built = [_vendor_node(vendor, f"sim-{vendor}-{i:04d}", config) for i in range(k)]
        node_list.extend(built)
        capacity[vendor] = sum(c.devcore for n in built for c in n.cards) / 100
        cards[vendor] = sum(len(n.cards) for n in built)
    total = sum(capacity.values()) or 1.0
    # A pod's vendor in proportion to the vendors' cards (not their capacity units, which differ).
    vendors = [v for v in cards if cards[v] > 0]
    weights = [cards[v] for v in vendors]
    nvidia_pods = generate_pods(pods, config=config, gpu_capacity=total, seed=seed)
    rng = random.Random(seed + 2)
    shapes = [s for s, _ in POD_SHAPES]
    shape_w = [w for _, w in POD_SHAPES]
    mean_demand = sum(n * m / 1000 * w for (n, m), w in POD_SHAPES) / sum(shape_w)
    lifetime = 0.85 * total * MEAN_INTERARRIVAL_S / max(mean_demand, 1e-9)
    out: list[SimPod] = []
    for base in nvidia_pods:
        vendor = rng.choices(vendors, weights)[0]
        if vendor == "nvidia" or base.gpu_demand <= 0:
            out.append(base)
            continue
        num, milli = rng.choices(
            [s for s in shapes if s[0] > 0], [w for s, w in zip(shapes, shape_w, strict=True) if s[0] > 0]
        )[0]
        out.append(_vendor_pod(vendor, base, num, milli, lifetime, rng))
    return Workload(
        nodes=node_list, pods=out,
        nodes_source=f"built-in mixed fleet (seed {seed}, {nodes} nodes: "
        + ", ".join(f"{v} {k}" for v, k in counts.items() if k) + ")",
        pods_source=f"built-in mixed workload (seed {seed}, {pods} pods)",
    )  # fmt: skip


def _vendor_pod(
    vendor: str, base: SimPod, num: int, milli: int, lifetime: float, rng: random.Random
) -> SimPod:
    shape = SHAPES[vendor]
    pct = max(1, math.ceil(milli / 10))
    if shape.whole_only:
        pct = 100
        num = max(1, math.ceil(num * milli / 1000))
    if shape.counts is not None:
        num = next(c for c in shape.counts if c >= num) if num <= max(shape.counts) else max(shape.counts)
    if num > 1:
        pct = 100  # several cards are whole cards on every vendor (Ascend, Moore Threads, Iluvatar rules)
    limits, annotations = shape.limits(num, pct)
    c = base.obj["spec"]["containers"][0]
    container = {
        "name": OPENB_CONTAINER,
        "resources": {"requests": dict(c["resources"]["requests"]), "limits": limits},
    }
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": base.name, "namespace": DEFAULT_NAMESPACE, "annotations": annotations},
           "spec": {"containers": [container]}}  # fmt: skip
    created = base.creation_time or 0.0
    return SimPod(
        name=base.name, cpu_milli=base.cpu_milli, memory_mib=base.memory_mib,
        gpu_demand=num * pct / 100 * shape.unit, obj=obj, creation_time=created,
        deletion_time=float(int(created + rng.expovariate(1 / lifetime))) + 1,
    )  # fmt: skip

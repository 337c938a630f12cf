"""The simulator's input model: nodes and pods as the scheduler extender would see them.

Every loader (openb CSV, Kubernetes YAML, the built-in generator) produces the same `Workload`: nodes as
Node JSON carrying `hami.io/node-nvidia-register` (so the replay goes through the same registration
decoder as the extender), pods as Pod JSON with HAMi resource limits and selection annotations (so the
replay goes through the same request parsing), plus the few numbers the simulator needs itself: the
CPU/memory that kube-scheduler fits before calling the extender, the pod's GPU demand in cards (for the
FGD-style fill mode) and its trace times.

The openb request mapping lives here (`openb_pod`), because the generator uses it too; the rules are in
../shared/data/alibaba-gpu-v2023/README.md and docs/simulate.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami import annotations as A
from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.model import Device
from hami.registration import encode_node_devices_json
from hami.vendors.nvidia import USE_GPUTYPE

#: Card memory (MiB) per openb model (trace README). G2 and G3 are undisclosed; these are the README's
#: stand-ins. Override with `--gpu-models MODEL=MiB,...`.
DEFAULT_GPU_MODELS: dict[str, int] = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G2": 32768,
    "G3": 81920,
}

#: kube-scheduler's default per-node pod limit (kubelet `maxPods`), used when a node does not say.
DEFAULT_MAX_PODS = 110

#: Namespace of every simulated pod that does not name one.
DEFAULT_NAMESPACE = "default"

#: Container name of openb pods (one container each).
OPENB_CONTAINER = "main"


class TraceError(InvalidRequest):
    """Bad simulator input. The message names the file, the line and the column or field."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node: allocatable CPU (millicores), memory (MiB) and pod slots, its Node JSON and its cards."""

    name: str
    cpu_milli: int
    memory_mib: int
    max_pods: int
    obj: dict[str, Any]
    cards: tuple[Device, ...] = ()


@dataclass(frozen=True, slots=True)
class SimPod:
    """One pod of the workload.

    `cpu_milli`/`memory_mib` are what kube-scheduler fits (sum of app containers, at least the largest
    init container). `gpu_demand` is in cards (num_gpu x gpu_milli / 1000 for openb). `obj` is the Pod
    JSON without `uid` (the engine gives every submission its own). `unplaceable` is a reason when the
    pod can never be placed (e.g. it names an unknown GPU model): the engine records it as failed
    without asking the scheduler. Times are seconds from the trace start; None when not given.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_demand: float
    obj: dict[str, Any]
    creation_time: float | None = None
    deletion_time: float | None = None
    unplaceable: str | None = None

    @property
    def is_gpu(self) -> bool:
        return self.gpu_demand > 0 or self.unplaceable is not None


@dataclass(slots=True)
class Workload:
    """A cluster and a pod list, with where they came from (for the summary line)."""

    nodes: list[SimNode]
    pods: list[SimPod]
    nodes_source: str = ""
    pods_source: str = ""
    gpu_models: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_GPU_MODELS))
    #: What the loaders left out and the user should hear about (one line each, for stderr).
    notes: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return sum(len(n.cards) for n in self.nodes)


def parse_gpu_models(spec: str, *, base: Mapping[str, int] | None = None) -> dict[str, int]:
    """`MODEL=MiB,MODEL=MiB` on top of `base` (default: DEFAULT_GPU_MODELS).

    Raises InvalidRequest naming the entry when it is not `NAME=positive integer`, or when a name holds
    a character that cannot appear in a card type or in `nvidia.com/use-gputype` (`,`, `|`, `:`, `;`).
    """
    out = dict(DEFAULT_GPU_MODELS if base is None else base)
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        name, sep, mib = entry.partition("=")
        name = name.strip()
        if not sep or not name or not mib.strip().isdigit() or int(mib) <= 0:
            raise InvalidRequest(f"--gpu-models: {entry!r} must be MODEL=MiB with MiB a positive integer")
        if any(c in name for c in ",|:; "):
            raise InvalidRequest(
                f"--gpu-models: model name {name!r} must not contain ',', '|', ':', ';' or spaces"
            )
        out[name] = int(mib)
    return out


def model_of(card_type: str) -> str:
    """The model name of a registered card type (``NVIDIA-T4`` -> ``T4``); other types unchanged."""
    return card_type[len("NVIDIA-") :] if card_type.startswith("NVIDIA-") else card_type


def gpu_node(
    name: str,
    *,
    cpu_milli: int,
    memory_mib: int,
    gpus: int,
    model: str,
    card_mib: int,
    config: DeviceConfig,
    max_pods: int = DEFAULT_MAX_PODS,
) -> SimNode:
    """A node with `gpus` cards of `model`, registered as HAMi's device plugin would.

    Each card: uuid ``GPU-<node>-<i>``, type ``NVIDIA-<model>``, split count / memory / core scaling from
    the node's effective `nvidia:` config (so `nodeconfig` overrides apply), NUMA 0 for the first half of
    the cards and 1 for the second half on nodes with 4 or more cards (two sockets, as on the openb
    8-card machines).
    """
    nv = config.nvidia_for_node(name)
    half = gpus // 2 if gpus >= 4 else gpus or 1
    cards = tuple(
        Device(
            uuid=f"GPU-{name}-{i}",
            index=i,
            count=nv.deviceSplitCount,
            devmem=int(card_mib * nv.deviceMemoryScaling),
            devcore=int(100 * nv.deviceCoreScaling),
            type=f"NVIDIA-{model}",
            numa=min(i // half, 1),
            health=True,
        )
        for i in range(gpus)
    )
    annotations = {A.NVIDIA_REGISTER: encode_node_devices_json(cards)} if cards else {}
    obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {
            "allocatable": {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": str(max_pods)}
        },
    }
    return SimNode(
        name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, max_pods=max_pods, obj=obj, cards=cards
    )


def milli_to_percent(gpu_milli: int) -> int:
    """An openb GPU share in thousandths as HAMi's integer percent: rounded up, so a pod never gets less
    than it asked (every value in the openb trace is a multiple of 10, where this is exact)."""
    return max(1, math.ceil(gpu_milli / 10))


def openb_pod(
    name: str,
    *,
    cpu_milli: int,
    memory_mib: int,
    num_gpu: int,
    gpu_milli: int,
    gpu_spec: Sequence[str],
    config: DeviceConfig,
    gpu_models: Mapping[str, int],
    creation_time: float | None = None,
    deletion_time: float | None = None,
) -> SimPod:
    """The Pod JSON for one openb row (the request mapping of the trace README, docs/simulate.md).

    - ``num_gpu == 0``: a CPU-only pod (no GPU resources; kube-scheduler places it alone).
    - ``gpu_milli == 1000``: ``nvidia.com/gpu: num_gpu`` and ``gpucores: 100`` (whole, exclusive cards).
    - ``gpu_milli < 1000``: ``nvidia.com/gpu: num_gpu`` with ``gpumem-percentage`` and ``gpucores`` of
      ``milli_to_percent(gpu_milli)`` each (the card's memory share follows its compute share).
    - `gpu_spec` (allowed models) becomes ``nvidia.com/use-gputype: A,B``; a model missing from
      `gpu_models` makes the pod unplaceable with that reason (the row itself is valid).
    Resource names come from `config.nvidia`. Callers validate ranges.
    """
    nv = config.nvidia
    limits: dict[str, str] = {}
    annotations: dict[str, str] = {}
    unplaceable = None
    demand = 0.0
    if num_gpu > 0:
        demand = num_gpu * gpu_milli / 1000
        limits[nv.resourceCountName] = str(num_gpu)
        if gpu_milli >= 1000:
            limits[nv.resourceCoreName] = "100"
        else:
            pct = str(milli_to_percent(gpu_milli))
            limits[nv.resourceMemoryPercentageName] = pct
            limits[nv.resourceCoreName] = pct
        models = list(dict.fromkeys(m for m in gpu_spec if m))
        if models:
            annotations[USE_GPUTYPE] = ",".join(models)
            unknown = [m for m in models if m not in gpu_models]
            if unknown:
                unplaceable = (
                    f"unknown GPU model {', '.join(unknown)} in gpu_spec "
                    f"(known: {', '.join(sorted(gpu_models))}; add it with --gpu-models MODEL=MiB)"
                )
    container = {
        "name": OPENB_CONTAINER,
        "resources": {"requests": {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi"}, "limits": limits},
    }
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": DEFAULT_NAMESPACE, "annotations": annotations},
        "spec": {"containers": [container]},
    }
    return SimPod(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpu_demand=demand,
        obj=obj,
        creation_time=creation_time,
        deletion_time=deletion_time,
        unplaceable=unplaceable,
    )

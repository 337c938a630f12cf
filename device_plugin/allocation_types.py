"""The names every part of `device_plugin.allocator.Allocator` shares, one floor below all of them:
its settings (`AllocatorSettings`), the API calls it makes (`Kube`), the pod being admitted
(`PendingPod`) and the attributes `Allocator.__init__` sets up for its parts (`AllocatorState`).

The parts (`device_plugin.lock_holder`, `device_plugin.recorded_cards`,
`device_plugin.allocate_response`, the mode responders of `device_plugin.mig` and `device_plugin.mps`)
import these from here, and `device_plugin.allocator` assembles them, so no part imports the assembly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from device_plugin.devices import DeviceState
from hami.model import ContainerDevice
from hami.vendors.nvidia import NvidiaConfig


class Kube(Protocol):
    """The part of `hami.kube.KubeClient` the allocator uses (sync; called through asyncio.to_thread)."""

    def get_node(self, name: str) -> dict | None: ...
    def get_pod(self, namespace: str, name: str) -> dict | None: ...
    def list_pods(self, *, field_selector: str | None = None) -> list[dict]: ...
    def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str,
        component: str,
        host: str | None,
    ) -> dict | None: ...
    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: dict[str, str | None] | None = None,
        uid: str | None = None,
    ) -> dict: ...


@dataclass(frozen=True)
class AllocatorSettings:
    """What Allocate needs besides the pod.

    `hook_path` is HAMi's HOOK_PATH (``/usr/local``): libvgpu lives in ``<hook_path>/vgpu`` on the host and
    in the container.
    """

    node_name: str
    scheduler_name: str = "hami-scheduler"
    resource_name: str = "nvidia.com/gpu"
    hook_path: str = "/usr/local"
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    lib_cuda_log_level: str = "1"
    disable_core_limit: bool = False
    #: The node's ``nvidia`` device config: how a container's spec reads as a request (resource names,
    #: memoryFactor, defaultMemory, defaultCores), the ceiling of what Allocate serves.
    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)

    @property
    def vgpu_dir(self) -> Path:
        return Path(self.hook_path) / "vgpu"


@dataclass(frozen=True)
class PendingPod:
    """The pod being admitted, its decoded to-allocate list and container names (init first)."""

    pod: dict
    entries: list[list[ContainerDevice]]
    containers: list[dict]
    n_init: int = 0
    boot_id: str = ""  # the node's status.nodeInfo.bootID when it was read for this request
    node_pods: frozenset[str] = frozenset()  # UIDs of the pods listed on this node for this request

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def uid(self) -> str:
        return self.pod["metadata"].get("uid", "")

    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class AllocatorState:
    """The attributes `device_plugin.allocator.Allocator.__init__` sets up and its parts read: declared
    once, for type checkers and readers; no state and no code of its own."""

    kube: Kube
    state: DeviceState
    settings: AllocatorSettings
    on_allocated: Callable[[], None]
    on_preferred_fallback: Callable[[str], None]
    on_card_mismatch: Callable[[], None]
    on_readmitted: Callable[[], None]
    _release_lock: Callable[..., bool]
    _init_ids: dict[str, set[str]]

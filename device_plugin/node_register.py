"""Publishing this node's cards for the scheduler: ``hami.io/node-nvidia-register`` and the handshake.

kubelet only learns device counts; memory, cores, model, NUMA and health per card reach the scheduler
through this node annotation (JSON, hami-legacy-spec §1.6.1), written at start, re-checked every 30 s
(HAMi's `WatchAndRegister`, §3.3) and immediately when a card's health changes, and patched only when
the encoded value differs. The handshake ``hami.io/node-handshake`` is answered with
``Reported_<time>`` whenever the registration changes or the scheduler's stamp is not ours (it writes
``Requesting_<time>`` and treats a node that never answers as gone; a stale ``Deleted_…`` left by an old
plugin would otherwise keep the node unregistered - user bug log R01).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from device_plugin.devices import DeviceState
from hami import annotations as ann
from hami.kube.retry import Backoff, retry_call_async
from hami.registration import encode_node_devices_json

log = logging.getLogger(__name__)

INTERVAL_S = 30.0  # HAMi's register period
RETRY_S = 5.0  # after an API error (HAMi: 5 s)


class NodeKube(Protocol):
    def get_node(self, name: str) -> dict | None: ...
    def patch_node_annotations(
        self, name: str, annotations: dict[str, str | None], *, resource_version: str | None = None
    ) -> dict: ...


class NodeRegistrar:
    """Keeps the registration annotation of `node_name` equal to `state`'s cards.

    `memory_scaling` / `core_scaling` are the node's effective deviceMemoryScaling / deviceCoreScaling,
    `mode` its operating mode (`hami-core`, `mig`, `mps`), which every card registers with.
    """

    def __init__(
        self,
        kube: NodeKube,
        node_name: str,
        state: DeviceState,
        *,
        memory_scaling: float = 1.0,
        core_scaling: float = 1.0,
        mode: str = "hami-core",
        interval_s: float = INTERVAL_S,
        retry_s: float = RETRY_S,
        clock: Callable[[], datetime] = datetime.now,
        on_patch: Callable[[], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.state = state
        self.memory_scaling = memory_scaling
        self.core_scaling = core_scaling
        self.mode = mode
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.clock = clock
        self.on_patch = on_patch or (lambda: None)
        self.on_error = on_error or (lambda: None)
        self.last_written: str | None = None

    def encode(self) -> str:
        """The annotation value for the current cards and health."""
        devices = self.state.registration(
            memory_scaling=self.memory_scaling, core_scaling=self.core_scaling, mode=self.mode
        )
        return encode_node_devices_json(devices)

    def sync_once(self) -> bool:
        """Compare and patch once (blocking). True when a patch was sent.

        Raises whatever the client raises (`hami.errors.HamiError`, connection errors); raises
        `hami.errors.NotFound` when the node object does not exist.
        """
        from hami.errors import NotFound

        node = self.kube.get_node(self.node_name)
        if node is None:
            raise NotFound(f"node {self.node_name} does not exist; is --node-name / NODE_NAME right?")
        annos = ann.pod_annotations(node)
        value = self.encode()
        patch: dict[str, str | None] = {}
        if annos.get(ann.NVIDIA_REGISTER) != value:
            patch[ann.NVIDIA_REGISTER] = value
        handshake = annos.get(ann.NVIDIA_HANDSHAKE)
        if patch or handshake is None or ann.decode_handshake(handshake).state != ann.HANDSHAKE_REPORTED:
            patch[ann.NVIDIA_HANDSHAKE] = ann.encode_handshake(ann.HANDSHAKE_REPORTED, self.clock())
        if not patch:
            return False
        self.kube.patch_node_annotations(self.node_name, patch)
        self.last_written = value
        self.on_patch()
        if ann.NVIDIA_REGISTER in patch:
            log.info("node %s: %s=%s", self.node_name, ann.NVIDIA_REGISTER, value)
        return True

    async def run(self) -> None:
        """Sync now, then every `interval_s` and on every health change, until cancelled.

        A failed sync is retried every `retry_s` (through `hami.kube.retry`); a health change cuts
        any wait short.
        """
        seen = self.state.version

        async def attempt() -> None:
            nonlocal seen
            seen = self.state.version
            await asyncio.to_thread(self.sync_once)

        async def wait(seconds: float) -> None:
            await self.state.wait_change(seen, timeout=seconds)

        while True:
            await retry_call_async(
                attempt,
                # Anything: the scheduler sees stale data meanwhile, and the next try may succeed.
                retry_on=(Exception,),
                backoff=Backoff(self.retry_s, factor=1.0),
                sleep=wait,
                on_retry=self._sync_failed,
            )
            await wait(self.interval_s)

    def _sync_failed(self, _failures: int, e: BaseException) -> None:
        self.on_error()
        log.warning("node %s: registration annotation update failed: %s", self.node_name, e)

"""Biren GPUs (CommonWord `Biren`): whole cards from `hami.io/node-biren-register`.

HAMi pkg/device/biren, with Project-HAMi/biren-device-plugin: the plugin registers HAMi's JSON
(`devicepairscore` and other unknown keys ignored), answers `hami.io/node-handshake-biren`, takes the
pod that holds `hami.io/mutex.lock` and reads (and erases) its entry of `hami.io/Biren-devices-allocated`
to set `BR_PHY_CARDS`. A request is whole cards (the list carries 0 MiB, 0 cores); the generic per-card
checks apply (health, UUID, slots, mutex).
Known consequence of the plugin erasing the allocated list: a scheduler restarted after Allocate no
longer counts that pod's cards (HAMi has the same gap); `hami.io/Biren-devices-to-allocate` is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hami.model import Device
from hami.vendors import common as C
from hami.vendors.base import registered


@dataclass(frozen=True)
class BirenConfig:
    """The `biren:` section (HAMi chart `devices.biren`, pkg/device/biren)."""

    resourceCountName: str = "birentech.com/gpu"
    """Whole Biren GPUs per container. Default `birentech.com/gpu` (HAMi chart)."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


class BirenVendor(C.ShareVendor):
    common_word = "Biren"
    register_key = "hami.io/node-biren-register"
    handshake_key = "hami.io/node-handshake-biren"
    to_allocate_key = "hami.io/Biren-devices-to-allocate"
    allocated_key = "hami.io/Biren-devices-allocated"
    use_uuid_key = "birentech.com/use-gpuuuid"
    nouse_uuid_key = "birentech.com/nouse-gpuuuid"
    uses_node_lock = True
    # Whole cards written as 0 MiB / 0 cores: percentage 0 makes the generic fit charge nothing.
    whole_card = (0, 0, 0)

    def __init__(self, config: BirenConfig | None = None) -> None:
        self.config = config or BirenConfig()
        super().__init__(self.config.resourceCountName)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return registered(
            node,
            self.register_key,
            lambda v: [replace(d, devcore=100) for d in C.register_json_cards(v, vendor=self.common_word)],
        )


def build(config: BirenConfig, device_config: Any) -> list[BirenVendor]:
    return [BirenVendor(config)]

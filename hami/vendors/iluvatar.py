"""Iluvatar CoreX GPUs: one vendor per chip (CommonWord = chip name, e.g. `BI-V150`), memory in 256 MiB units.

HAMi pkg/device/iluvatar, enabled by `scheduler.enableIluvatar` (HAMi `--enable-iluvatar`, chart
`devices.iluvatar.enabled`), one backend per `iluvatars:` entry (chart chips MR-V100, MR-V50, BI-V150,
BI-V100). Iluvatar's device plugin registers the cards in HAMi's colon format on
`hami.io/node-<chip>-register`, answers the handshake `hami.io/node-handshake-<chip>`, pops the
container's entry of `hami.io/<chip>-devices-to-allocate` under `hami.io/mutex.lock`, and its limiter
reads the container name from env `SOL_CONTINER_NAME` (sic, the plugin's spelling), which the webhook adds.
A container without cores shares compute (default 0, unlike Cambricon/Hygon); asking for several cards
makes them whole cards (the webhook rewrites `<chip>.vCore` to 100 x count, as HAMi does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.configparse import parse_section
from hami.errors import ConfigError
from hami.model import Device
from hami.quantity import to_count
from hami.registration import decode_node_devices_colon
from hami.vendors.base import MutationResult, registered
from hami.vendors.common import ShareVendor, field_name, in_limits

ENV_CONTAINER_NAME = "SOL_CONTINER_NAME"  # sic: read by Iluvatar's libvgpu-control.so
UNIT_MIB = 256
CHART_CHIPS = ("MR-V100", "MR-V50", "BI-V150", "BI-V100")


@dataclass(frozen=True)
class IluvatarChip:
    """One entry of `iluvatars:` (HAMi chart `devices.iluvatar`), one scheduled chip."""

    chipName: str = ""
    """The chip as the device plugin names it (e.g. `BI-V150`). Default "" (required)."""
    commonWord: str = ""
    """CommonWord: request type and the `<cw>` in `hami.io/node-<cw>-register`; "" = `chipName`. Default ""."""
    resourceCountName: str = ""
    """Cards per container; "" = `iluvatar.ai/<cw>-vgpu` (HAMi chart). Default ""."""
    resourceMemoryName: str = ""
    """Per-card memory in 256 MiB units; "" = `iluvatar.ai/<cw>.vMem` (HAMi chart). Default ""."""
    resourceCoreName: str = ""
    """Per-card compute in percent (absent = 0, shared); "" = `iluvatar.ai/<cw>.vCore` (HAMi chart). Default ""."""

    @property
    def word(self) -> str:
        return self.commonWord or self.chipName


def _chart_chips() -> tuple[IluvatarChip, ...]:
    return tuple(IluvatarChip(chipName=c) for c in CHART_CHIPS)


@dataclass(frozen=True)
class IluvatarConfig:
    """The `iluvatars:` section: a list of chips (HAMi chart `devices.iluvatar`, pkg/device/iluvatar)."""

    chips: tuple[IluvatarChip, ...] = field(default_factory=_chart_chips)
    """The chips to schedule, one vendor each (the YAML list itself). Default: the chart's MR-V100, MR-V50, BI-V150, BI-V100."""

    DOC_PARTS = (IluvatarChip,)

    def validate(self) -> None:
        seen = set()
        for i, chip in enumerate(self.chips):
            if not chip.word:
                raise ConfigError(
                    f"iluvatars[{i}].chipName: must not be empty; valid: a chip name such as BI-V150"
                )
            if chip.word in seen:
                raise ConfigError(f"iluvatars[{i}].commonWord: {chip.word!r} is listed twice")
            seen.add(chip.word)


def parse(key: str, raw: Any) -> IluvatarConfig:
    if raw is None:
        return IluvatarConfig()
    if not isinstance(raw, list):
        raise ConfigError(
            f"{key}: must be a list of chips ({{chipName, commonWord, resourceCountName, ...}})"
        )
    return IluvatarConfig(tuple(parse_section(IluvatarChip, f"{key}[{i}]", e) for i, e in enumerate(raw)))


class IluvatarVendor(ShareVendor):
    uses_node_lock = True
    memory_unit_mib = UNIT_MIB
    default_cores = 0
    quota_memory_factor = UNIT_MIB

    def __init__(self, chip: IluvatarChip) -> None:
        cw = self.common_word = chip.word
        self.register_key = f"hami.io/node-{cw}-register"
        self.handshake_key = f"hami.io/node-handshake-{cw}"
        self.to_allocate_key = f"hami.io/{cw}-devices-to-allocate"
        self.allocated_key = f"hami.io/{cw}-devices-allocated"
        self.use_uuid_key = f"hami.io/use-{cw}-uuid"
        self.nouse_uuid_key = f"hami.io/no-use-{cw}-uuid"
        super().__init__(
            chip.resourceCountName or f"iluvatar.ai/{cw}-vgpu",
            chip.resourceMemoryName or f"iluvatar.ai/{cw}.vMem",
            chip.resourceCoreName or f"iluvatar.ai/{cw}.vCore",
        )

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return registered(
            node, self.register_key, lambda v: decode_node_devices_colon(v, vendor=self.common_word)
        )

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """Count in limits: several cards become whole cards (`vCore` = 100 x count, HAMi overwrites a
        user value); env `SOL_CONTINER_NAME=<container>` is added for the limiter."""
        n = self._names
        if not in_limits(container, n.count):
            return MutationResult()
        limits = container["resources"]["limits"]
        count = to_count(limits[n.count], resource=field_name(container, n.count))
        if count > 1 and n.cores:
            limits[n.cores] = str(100 * count)
        self.container_request(container)
        name = container.get("name")
        env = container.setdefault("env", []) if name else []
        if name and not any(e.get("name") == ENV_CONTAINER_NAME for e in env):
            env.append({"name": ENV_CONTAINER_NAME, "value": name})
        return MutationResult(uses_device=True)


def build(config: IluvatarConfig, device_config: Any) -> list[IluvatarVendor]:
    if device_config is None or not device_config.scheduler.enableIluvatar:
        return []
    return [IluvatarVendor(chip) for chip in config.chips]

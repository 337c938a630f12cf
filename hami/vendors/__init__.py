"""The vendor registry: one table line per device-config section, from YAML key to enabled vendors.

Each line names the section's YAML key (HAMi's `device-config.yaml` key), its config dataclass (which
lives in the vendor's module, with its parsing and validation), and how that section becomes vendor
objects keyed by CommonWord. `hami.config` drives section parsing, validation and the "valid: ..."
message of unknown keys from this table, so adding a vendor is one module plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hami.configparse import parse_section
from hami.vendors.base import MutationResult, ResourceNames, Vendor
from hami.vendors.hygon import HygonConfig, HygonVendor
from hami.vendors.nvidia import NvidiaConfig, NvidiaVendor

if TYPE_CHECKING:
    from hami.config import DeviceConfig

__all__ = [
    "VENDOR_SECTIONS", "MutationResult", "ResourceNames", "Vendor", "VendorSection", "build_vendors",
    "HygonVendor", "NvidiaVendor",
]  # fmt: skip


@dataclass(frozen=True)
class VendorSection:
    """One device-config section: its dataclass, how it is parsed, and the vendors it enables.

    `build(section_config, device_config)` returns the section's vendors (several for list sections
    such as Ascend's `vnpus.configs`; none when a scheduler switch such as `enableAscend` is off).
    `parse(key, raw)` defaults to the flat `hami.configparse.parse_section` with `aliases`.
    """

    config: type
    build: Callable[[Any, DeviceConfig], list[Vendor]]
    aliases: Mapping[str, str] = field(default_factory=dict)
    custom_parse: Callable[[str, Any], Any] | None = None

    def parse(self, key: str, raw: Any) -> Any:
        if self.custom_parse is not None:
            return self.custom_parse(key, raw)
        return parse_section(self.config, key, raw, aliases=self.aliases)


#: YAML key -> section, in HAMi's registration order (NVIDIA first). One line per vendor section.
VENDOR_SECTIONS: dict[str, VendorSection] = {
    "nvidia": VendorSection(
        NvidiaConfig, lambda c, d: [NvidiaVendor(c)], aliases={"defaultMem": "defaultMemory"}
    ),
    "hygon": VendorSection(HygonConfig, lambda c, d: [HygonVendor(c)]),
}


#: HAMi sections of vendors not scheduled here yet: accepted and ignored, so HAMi's ConfigMap loads.
UNIMPLEMENTED_SECTIONS = frozenset({
    "cambricon", "metax", "mthreads", "iluvatars", "enflame", "kunlun", "awsneuron", "amd", "vastai",
    "biren", "vnpus",
})  # fmt: skip


def build_vendors(config: DeviceConfig | None = None) -> dict[str, Vendor]:
    """The enabled vendors in a stable order (NVIDIA first), keyed by CommonWord.

    Raises ConfigError when two sections register the same CommonWord (e.g. an Iluvatar chip named
    like an Ascend one).
    """
    if config is None:
        from hami.config import DeviceConfig  # the config module imports this one

        config = DeviceConfig()
    out: dict[str, Vendor] = {}
    for key, entry in VENDOR_SECTIONS.items():
        for vendor in entry.build(config.section(key), config):
            if vendor.common_word in out:
                from hami.errors import ConfigError

                raise ConfigError(f"{key}: CommonWord {vendor.common_word!r} is registered twice")
            out[vendor.common_word] = vendor
    return out

"""The vendor registry: one table line per device-config section, from YAML key to enabled vendors.

Each line names the section's YAML key (HAMi's `device-config.yaml` key), its config dataclass (which
lives in the vendor's module, with its parsing and validation), and how that section becomes vendor
objects keyed by CommonWord. `hami.config` drives section parsing, validation and the "valid: ..."
message of unknown keys from this table, so adding a vendor is one module plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami.configparse import parse_section
from hami.vendors import (
    amd,
    ascend,
    awsneuron,
    biren,
    cambricon,
    enflame,
    iluvatar,
    kunlun,
    metax,
    mthreads,
    vastai,
)
from hami.vendors.base import MutationResult, ResourceNames, Vendor
from hami.vendors.hygon import HygonConfig, HygonVendor
from hami.vendors.nvidia import NvidiaConfig, NvidiaVendor
from hami.vendors.nvidia import parse_config as nvidia_parse_config

__all__ = [
    "VENDOR_SECTIONS", "MutationResult", "ResourceNames", "Vendor", "VendorSection", "build_vendors",
    "HygonVendor", "NvidiaVendor",
]  # fmt: skip


class VendorSwitches(Protocol):
    """The `scheduler:` switches of the vendors that are off by default (`hami.config.SchedulerConfig`)."""

    @property
    def enableAscend(self) -> bool: ...

    @property
    def enableIluvatar(self) -> bool: ...


class SectionSource(Protocol):
    """What the table reads of a device configuration (`hami.config.DeviceConfig`): a vendor section by
    its YAML key, and the scheduler switches. A protocol, not the class: the configuration parses its
    sections with this table, so it lies above it."""

    @property
    def scheduler(self) -> VendorSwitches: ...

    def section(self, key: str) -> Any: ...


@dataclass(frozen=True)
class VendorSection:
    """One device-config section: its dataclass, how it is parsed, and the vendors it enables.

    `build(section_config, device_config)` returns the section's vendors (several for list sections
    such as Ascend's `vnpus.configs`; none when a scheduler switch such as `enableAscend` is off or
    `device_config` is None).
    `parse(key, raw)` defaults to the flat `hami.configparse.parse_section` with `aliases`.
    """

    config: type
    build: Callable[[Any, SectionSource | None], list[Vendor]]
    aliases: Mapping[str, str] = field(default_factory=dict)
    custom_parse: Callable[[str, Any], Any] | None = None

    def parse(self, key: str, raw: Any) -> Any:
        if self.custom_parse is not None:
            return self.custom_parse(key, raw)
        return parse_section(self.config, key, raw, aliases=self.aliases)


#: YAML key -> section, in HAMi's registration order (NVIDIA first). One line per vendor section.
VENDOR_SECTIONS: dict[str, VendorSection] = {
    "nvidia": VendorSection(
        NvidiaConfig,
        lambda c, d: [NvidiaVendor(c)],
        aliases={"defaultMem": "defaultMemory"},
        custom_parse=nvidia_parse_config,
    ),
    "cambricon": VendorSection(cambricon.CambriconConfig, cambricon.build),
    "hygon": VendorSection(HygonConfig, lambda c, d: [HygonVendor(c)]),
    "enflame": VendorSection(enflame.EnflameConfig, enflame.build),
    "mthreads": VendorSection(mthreads.MthreadsConfig, mthreads.build),
    "metax": VendorSection(metax.MetaxConfig, metax.build),
    "kunlun": VendorSection(kunlun.KunlunConfig, kunlun.build),
    "awsneuron": VendorSection(awsneuron.AWSNeuronConfig, awsneuron.build),
    "amd": VendorSection(amd.AMDConfig, amd.build),
    "vastai": VendorSection(vastai.VastaiConfig, vastai.build),
    "biren": VendorSection(biren.BirenConfig, biren.build),
    "vnpus": VendorSection(ascend.AscendConfig, ascend.build, custom_parse=ascend.parse),
    "iluvatars": VendorSection(iluvatar.IluvatarConfig, iluvatar.build, custom_parse=iluvatar.parse),
}


#: HAMi sections of vendors not scheduled here: accepted and ignored, so HAMi's ConfigMap loads (none left).
UNIMPLEMENTED_SECTIONS: frozenset[str] = frozenset()


def build_vendors(config: SectionSource | None = None) -> dict[str, Vendor]:
    """The enabled vendors in a stable order (NVIDIA first), keyed by CommonWord.

    Raises ConfigError when two sections register the same CommonWord (e.g. an Iluvatar chip named
    like an Ascend one).
    """
    out: dict[str, Vendor] = {}
    for key, entry in VENDOR_SECTIONS.items():
        # No config: every section's defaults, and the switched vendors (Ascend, Iluvatar) stay off.
        section = config.section(key) if config is not None else entry.config()
        for vendor in entry.build(section, config):
            if vendor.common_word in out:
                from hami.errors import ConfigError

                raise ConfigError(f"{key}: CommonWord {vendor.common_word!r} is registered twice")
            out[vendor.common_word] = vendor
    return out


def pod_takes_node_lock(pod: Mapping[str, Any] | None, vendors: Mapping[str, Vendor]) -> bool:
    """Whether bind takes `hami.io/mutex.lock` for `pod` (HAMi: an app container asks for a vendor whose
    device plugin finds the pod through that lock). Vendors whose plugins find the pod by their own
    annotations (Moore Threads, MetaX GPU, Kunlunxin XPU, AWS Neuron, Enflame, Cambricon) release no
    such lock, so taking it would block the node's next bind until the lock expires. Unknown or invalid
    pods take the lock (the safe side)."""
    if pod is None:
        return True
    from hami.errors import InvalidRequest
    from hami.pods import ContainerKind, requests

    try:
        specs = requests(pod, vendors)
    except InvalidRequest:
        return True
    asked = {r.vendor for c in specs if c.kind is ContainerKind.APP for r in c.requests}
    return not asked or any(vendors[v].uses_node_lock for v in asked if v in vendors)

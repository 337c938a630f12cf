"""The vendor registry: one line per vendor (CommonWord -> implementation), built from the device config."""

from __future__ import annotations

from hami.config import DeviceConfig
from hami.vendors.base import MutationResult, ResourceNames, Vendor
from hami.vendors.hygon import HygonVendor
from hami.vendors.nvidia import NvidiaVendor

__all__ = ["MutationResult", "ResourceNames", "Vendor", "build_vendors", "HygonVendor", "NvidiaVendor"]


def build_vendors(config: DeviceConfig | None = None) -> dict[str, Vendor]:
    """The enabled vendors in a stable order (NVIDIA first), keyed by CommonWord."""
    config = config or DeviceConfig()
    out: dict[str, Vendor] = {"NVIDIA": NvidiaVendor(config.nvidia)}
    if config.hygon is not None:
        out["DCU"] = HygonVendor(config.hygon)
    return out

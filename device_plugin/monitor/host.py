"""Whole-card figures for the ``hami_host_gpu_*`` families: NVML on a GPU node, a YAML file in tests.

The scanner calls `read()` once per scan, on its own thread, so a slow NVML call never delays a
scrape. A backend that fails at run time logs and returns an empty list rather than raising: the
card families are then absent for that scan, and the per-container families keep flowing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import yaml

from hami.errors import ConfigError

log = logging.getLogger(__name__)

MIB = 1 << 20
HOST_BACKENDS = ("nvidia", "fake")


@dataclass(frozen=True)
class HostGpu:
    """One physical card: memory used in bytes, utilisations in percent (0-100, as NVML reports)."""

    index: int
    uuid: str
    device_type: str  # HAMi's monitor label: "NVIDIA-" + the NVML name, always prefixed
    memory_used_bytes: int
    utilization_percent: float
    memory_utilization_percent: float
    memory_total_bytes: int = 0  # the card's memory; 0 = not known


class HostBackend(Protocol):
    name: str

    def read(self) -> list[HostGpu]:
        """Every card's current figures; [] when the source is unusable right now (logged)."""
        ...

    def close(self) -> None: ...


def device_type(nvml_name: str) -> str:
    """HAMi's monitor prefixes the NVML name unconditionally: ``NVIDIA H200`` -> ``NVIDIA-NVIDIA H200``."""
    return f"NVIDIA-{nvml_name.strip()}"


class NvidiaHost:
    """Cards through NVML (`nvidia-ml-py`, imported as `pynvml`; injectable for tests).

    Raises `ConfigError` at construction when NVML cannot be initialised (no driver on this node).
    """

    name = "nvidia"

    def __init__(self, nvml: ModuleType | None = None) -> None:
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - only GPU nodes need the driver library
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - pynvml raises its own NVMLError family
            raise ConfigError(
                f"--backend nvidia: NVML init failed: {e}; use --backend fake without a GPU"
            ) from None
        self._closed = False

    def read(self) -> list[HostGpu]:
        n = self.nvml
        out = []
        try:
            for i in range(n.nvmlDeviceGetCount()):
                h = n.nvmlDeviceGetHandleByIndex(i)
                mem = n.nvmlDeviceGetMemoryInfo(h)
                util = n.nvmlDeviceGetUtilizationRates(h)
                out.append(
                    HostGpu(
                        index=i,
                        uuid=_text(n.nvmlDeviceGetUUID(h)),
                        device_type=device_type(_text(n.nvmlDeviceGetName(h))),
                        memory_used_bytes=int(mem.used),
                        utilization_percent=float(util.gpu),
                        memory_utilization_percent=float(util.memory),
                        memory_total_bytes=int(mem.total),
                    )
                )
        except Exception as e:  # noqa: BLE001 - an XID'd card must not stop the per-container metrics
            log.warning("NVML read failed: %s; host metrics skipped this scan", e)
            return []
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass


_KEYS = {"uuid", "index", "model", "memory_mib", "memory_used_mib", "utilization", "memory_utilization"}
_IGNORED = {"numa", "healthy"}  # the device plugin's fake cards file may be shared with the monitor


def parse_host_cards(data: Any, *, source: str) -> list[HostGpu]:
    """Validate a ``cards:`` document (see `FakeHost`); raises ConfigError naming the card and the field."""
    if not isinstance(data, dict) or not isinstance(data.get("cards"), list):
        raise ConfigError(f"{source}: want a mapping with a 'cards:' list of {{{', '.join(sorted(_KEYS))}}}")
    cards = []
    for i, raw in enumerate(data["cards"]):
        where = f"{source}: cards[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a mapping")
        unknown = set(raw) - _KEYS - _IGNORED
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid: {sorted(_KEYS | _IGNORED)}")
        for key in ("uuid", "model"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise ConfigError(f"{where}.{key}: must be a non-empty string")
        nums: dict[str, float] = {}
        for key, default, top in (
            ("index", i, None), ("memory_mib", 0, None), ("memory_used_mib", 0, None), ("utilization", 0, 100),
            ("memory_utilization", 0, 100),
        ):  # fmt: skip
            val = raw.get(key, default)
            if isinstance(val, bool) or not isinstance(val, int | float) or val < 0 or (top and val > top):
                bound = f"between 0 and {top}" if top else ">= 0"
                raise ConfigError(f"{where}.{key}: {val!r} must be a number {bound}")
            nums[key] = val
        cards.append(
            HostGpu(
                index=int(nums["index"]),
                uuid=raw["uuid"].strip(),
                device_type=device_type(raw["model"]),
                memory_used_bytes=int(nums["memory_used_mib"] * MIB),
                utilization_percent=float(nums["utilization"]),
                memory_utilization_percent=float(nums["memory_utilization"]),
                memory_total_bytes=int(nums["memory_mib"] * MIB),
            )
        )
    return cards


class FakeHost:
    """Cards from a YAML file, re-read on every scan so a test can change the figures::

        cards:
          - {uuid: GPU-aaaa, index: 0, model: Tesla V100-PCIE-32GB, memory_used_mib: 1200,
             utilization: 35, memory_utilization: 10}

    No file (`path` None) means no cards. The file is validated at construction (`ConfigError`); a file
    that later becomes invalid is logged and yields [] until it is fixed.
    """

    name = "fake"

    def __init__(self, path: str | None) -> None:
        self.path = path
        if path is not None:
            self._load()

    def _load(self) -> list[HostGpu]:
        assert self.path is not None
        try:
            data = yaml.safe_load(Path(self.path).read_text())
        except OSError as e:
            raise ConfigError(f"--fake-config {self.path}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"--fake-config {self.path}: not YAML: {e}") from None
        return parse_host_cards(data, source=f"--fake-config {self.path}")

    def read(self) -> list[HostGpu]:
        if self.path is None:
            return []
        try:
            return self._load()
        except ConfigError as e:
            log.warning("%s; host metrics skipped this scan", e)
            return []

    def close(self) -> None:
        pass


def make_host(name: str, *, fake_config: str | None = None, nvml: ModuleType | None = None) -> HostBackend:
    """The host backend called `name` (one of `HOST_BACKENDS`); raises ConfigError otherwise."""
    if name == "nvidia":
        return NvidiaHost(nvml)
    if name == "fake":
        return FakeHost(fake_config)
    raise ConfigError(f"--backend: {name!r} is not a host backend; valid: {', '.join(HOST_BACKENDS)}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

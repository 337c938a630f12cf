"""The device configuration shared by the scheduler extender, the webhook, the device plugin and `hami simulate`.

It is HAMi's `device-config.yaml` (hami-legacy-spec §4.2, ConfigMap `<fullname>-scheduler-device`) with the
same key names, so an existing ConfigMap works unchanged, plus two small additions: a `scheduler:` section
(default node / card policies, otherwise command-line flags in HAMi) and per-node overrides (`nodeconfig:`,
HAMi's per-node device-plugin JSON of §4.3). Unknown keys inside a section we implement are errors naming
the key (a typo must not silently fall back to a default). Each vendor's section is a dataclass in its
`hami/vendors/<vendor>.py` module, registered in the table `hami.vendors.VENDOR_SECTIONS`; every field
carries an attribute docstring (unit, default, HAMi source) from which docs/configuration.md is generated
(`python scripts/gen_configuration_doc.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from hami.configparse import coerce, parse_section, require
from hami.errors import ConfigError
from hami.scoring import CARD_POLICIES, NODE_POLICIES
from hami.vendors import UNIMPLEMENTED_SECTIONS, VENDOR_SECTIONS
from hami.vendors.hygon import HygonConfig
from hami.vendors.nvidia import CORE_POLICIES, MIG_STRATEGIES, OPERATING_MODES, NvidiaConfig

__all__ = [
    "CARD_POLICIES", "CORE_POLICIES", "NODE_POLICIES", "DeviceConfig", "HygonConfig", "NodeOverride",
    "NvidiaConfig", "SCHEDULER_SWITCHES", "SchedulerConfig", "load_config", "load_config_file",
    "with_switches",
]  # fmt: skip


@dataclass(frozen=True)
class SchedulerConfig:
    """The `scheduler:` section (ours; HAMi sets these with scheduler flags)."""

    nodeSchedulerPolicy: str = "binpack"
    """Default node policy `binpack`, `spread` or `fragmentation` (HAMi `--node-scheduler-policy`; `fragmentation` is ours). Default `binpack`."""
    gpuSchedulerPolicy: str = "spread"
    """Default card policy, a comma chain of binpack, spread, numa, mutex, topology-aware,
    fragmentation (HAMi `--gpu-scheduler-policy`; `fragmentation` is ours). Default `spread`."""
    schedulerName: str = "hami-scheduler"
    """`spec.schedulerName` of the pods this scheduler places and counts (HAMi `--scheduler-name`). Default `hami-scheduler`."""
    enableAscend: bool = False
    """Schedule Huawei Ascend NPUs, one vendor per `vnpus.configs` entry (HAMi `--enable-ascend`,
    chart `devices.ascend.enabled`). The extender's and the webhook's `--enable-ascend` flag
    (`--enable-ascend=false` too) wins over this key. Default false."""
    enableIluvatar: bool = False
    """Schedule Iluvatar GPUs, one vendor per `iluvatars` entry (HAMi `--enable-iluvatar`, chart
    `devices.iluvatar.enabled`). The extender's and the webhook's `--enable-iluvatar` flag wins over
    this key. Default false."""

    def validate(self) -> None:
        """Raise ConfigError naming the first invalid key."""
        require(
            self.nodeSchedulerPolicy in NODE_POLICIES, "scheduler.nodeSchedulerPolicy", self.nodeSchedulerPolicy,
            ", ".join(NODE_POLICIES),
        )  # fmt: skip
        for part in self.gpuSchedulerPolicy.split(","):
            require(
                part.strip() in CARD_POLICIES, "scheduler.gpuSchedulerPolicy", self.gpuSchedulerPolicy,
                "a comma chain of " + ", ".join(CARD_POLICIES),
            )  # fmt: skip


@dataclass(frozen=True)
class NodeOverride:
    """One entry of `nodeconfig:` (HAMi's per-node device-plugin JSON); None = use the `nvidia:` value."""

    name: str
    """The node name the entry applies to."""
    deviceSplitCount: int | None = None
    """Slots per card on this node (HAMi `devicesplitcount`); unset or 0 = `nvidia.deviceSplitCount`."""
    deviceMemoryScaling: float | None = None
    """Memory scaling on this node (HAMi `devicememoryscaling`); unset or 0 = `nvidia.deviceMemoryScaling`."""
    deviceCoreScaling: float | None = None
    """Core scaling on this node (HAMi `devicecorescaling`); unset or 0 = `nvidia.deviceCoreScaling`."""
    preConfiguredDeviceMemory: int | None = None
    """MiB per card when NVML cannot report it, on this node (HAMi `preconfigureddevicememory`); unset or 0
    = `nvidia.preConfiguredDeviceMemory`."""
    libCudaLogLevel: int | None = None
    """libvgpu log level on this node, 0..4 (HAMi `libcudaloglevel`, often quoted); unset or 0 =
    `nvidia.libCudaLogLevel`."""
    enableNumaTopology: bool | None = None
    """NUMA topology on this node (HAMi `enablenumatopology`); unset or false = `nvidia.enableNumaTopology`."""
    operatingMode: str | None = None
    """How this node's cards are shared: `hami-core`, `mig` or `mps` (HAMi `operatingmode`); unset =
    `nvidia.operatingMode`."""
    migStrategy: str | None = None
    """MIG instances an administrator made on this node: `none`, `single` or `mixed` (HAMi
    `migstrategy`); unset = `nvidia.migStrategy`."""

    def validate(self) -> None:
        """Raise ConfigError naming the first invalid key."""
        where = f"nodeconfig[{self.name}]"
        if self.operatingMode is not None:
            require(
                self.operatingMode in OPERATING_MODES, f"{where}.operatingmode", self.operatingMode,
                ", ".join(OPERATING_MODES),
            )  # fmt: skip
        if self.migStrategy is not None:
            require(
                self.migStrategy in MIG_STRATEGIES, f"{where}.migstrategy", self.migStrategy,
                ", ".join(MIG_STRATEGIES),
            )  # fmt: skip
        if self.deviceSplitCount is not None:
            require(
                self.deviceSplitCount >= 1,
                f"{where}.devicesplitcount",
                self.deviceSplitCount,
                "an integer >= 1",
            )
        for key, val in (
            ("devicememoryscaling", self.deviceMemoryScaling),
            ("devicecorescaling", self.deviceCoreScaling),
        ):
            if val is not None:
                require(val > 0, f"{where}.{key}", val, "a number > 0")
        if self.preConfiguredDeviceMemory is not None:
            require(
                self.preConfiguredDeviceMemory >= 0,
                f"{where}.preconfigureddevicememory",
                self.preConfiguredDeviceMemory,
                "MiB >= 0",
            )
        if self.libCudaLogLevel is not None:
            require(0 <= self.libCudaLogLevel <= 4, f"{where}.libcudaloglevel", self.libCudaLogLevel, "0..4")


@dataclass(frozen=True)
class DeviceConfig:
    """The whole device configuration: the `nvidia:` section, every other vendor section by its YAML key
    (`sections`, absent keys = that section's defaults), the `scheduler:` section and per-node overrides."""

    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    nodes: Mapping[str, NodeOverride] = field(default_factory=dict)
    sections: Mapping[str, Any] = field(default_factory=dict)

    def section(self, key: str) -> Any:
        """The parsed section `key` (`cambricon`, `vnpus`, ...), or its defaults when the file had none.

        Raises KeyError for a key that is not in the vendor table.
        """
        if key == "nvidia":
            return self.nvidia
        found = self.sections.get(key)
        return found if found is not None else VENDOR_SECTIONS[key].config()

    def nvidia_for_node(self, node: str) -> NvidiaConfig:
        """The `nvidia:` section with `node`'s overrides applied."""
        o = self.nodes.get(node)
        if o is None:
            return self.nvidia
        changes = {
            f.name: getattr(o, f.name)
            for f in fields(o)
            if f.name != "name" and getattr(o, f.name) is not None
        }
        return replace(self.nvidia, **changes)


#: HAMi's per-node keys that override `nvidia:` values (lower case, as HAMi's JSON spells them).
_NODE_KEYS: dict[str, tuple[str, type]] = {
    "devicesplitcount": ("deviceSplitCount", int),
    "devicememoryscaling": ("deviceMemoryScaling", float),
    "devicecorescaling": ("deviceCoreScaling", float),
    "preconfigureddevicememory": ("preConfiguredDeviceMemory", int),
    "libcudaloglevel": ("libCudaLogLevel", int),
    "enablenumatopology": ("enableNumaTopology", bool),
    "operatingmode": ("operatingMode", str),
    "migstrategy": ("migStrategy", str),
}
#: HAMi's other per-node keys: accepted so HAMi's file loads, not used (this device plugin has no device
#: filter and always answers GetPreferredAllocation).
_NODE_KEYS_NOT_USED = ("filterdevices", "enablegetpreferredallocation")


def _node_overrides(raw: Any) -> dict[str, NodeOverride]:
    if raw is None:
        return {}
    if isinstance(raw, dict) and "nodeconfig" in raw:
        raw = raw["nodeconfig"]
    if not isinstance(raw, list):
        raise ConfigError(
            "nodeconfig: must be a list of {name, devicesplitcount, devicememoryscaling, devicecorescaling}"
        )
    out = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"nodeconfig[{i}]: must be a mapping with a string 'name'")
        kw: dict[str, Any] = {}
        for k, v in entry.items():
            lk = str(k).lower()
            if lk == "name" or lk in _NODE_KEYS_NOT_USED:
                continue
            if lk not in _NODE_KEYS:
                valid = ", ".join(["name", *_NODE_KEYS, *_NODE_KEYS_NOT_USED])
                raise ConfigError(f"nodeconfig[{i}].{k}: unknown key; valid keys: {valid}")
            # HAMi: zero fields mean "not overridden" (a quoted "0" too, as for libcudaloglevel).
            if v in (0, None, False, "0", ""):
                continue
            field_name, typ = _NODE_KEYS[lk]
            kw[field_name] = coerce(f"nodeconfig[{i}]", k, v, typ)
        out[entry["name"]] = NodeOverride(name=entry["name"], **kw)
    return out


def load_config(data: Mapping[str, Any] | None) -> DeviceConfig:
    """Build a DeviceConfig from the parsed YAML mapping (None = all defaults). Raises ConfigError.

    Vendor sections are parsed and validated by the table in `hami.vendors` (one line per section).
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("device config: top level must be a mapping")
    valid = [*VENDOR_SECTIONS, "scheduler", "nodeconfig", *sorted(UNIMPLEMENTED_SECTIONS)]
    for key in data:
        if key not in valid:
            raise ConfigError(f"{key}: unknown top-level key; valid: {', '.join(valid)}")
    parsed = {key: entry.parse(key, data.get(key)) for key, entry in VENDOR_SECTIONS.items() if key in data}
    cfg = DeviceConfig(
        nvidia=parsed.pop("nvidia", None) or NvidiaConfig(),
        scheduler=parse_section(SchedulerConfig, "scheduler", data.get("scheduler")),
        nodes=_node_overrides(data.get("nodeconfig")),
        sections=parsed,
    )
    cfg.nvidia.validate()
    for value in parsed.values():
        value.validate()
    cfg.scheduler.validate()
    for o in cfg.nodes.values():
        o.validate()
    return cfg


#: HAMi's scheduler switches for the vendors that are off by default: flag dest (``--enable-ascend``)
#: -> the `scheduler:` key it sets. The extender and the webhook take them as flags (and
#: ``HAMI_EXTENDER_ENABLE_ASCEND``-style variables) over the device config (`hami.settings`).
SCHEDULER_SWITCHES: Mapping[str, str] = {"enable_ascend": "enableAscend", "enable_iluvatar": "enableIluvatar"}


def with_switches(config: DeviceConfig, values: Mapping[str, Any]) -> DeviceConfig:
    """`config` with each `SCHEDULER_SWITCHES` key set from `values` (flag dest -> bool); a dest absent
    from `values` keeps the file's value. The same object when nothing changes."""
    changes = {
        key: bool(values[dest])
        for dest, key in SCHEDULER_SWITCHES.items()
        if dest in values and bool(values[dest]) != getattr(config.scheduler, key)
    }
    return replace(config, scheduler=replace(config.scheduler, **changes)) if changes else config


def load_config_file(path: str | Path | None) -> DeviceConfig:
    """Read a device-config YAML file (None = defaults).

    Raises ConfigError whose one-line message starts with the file name: unreadable file, invalid YAML
    (with its line and column), or an invalid value (naming the key).
    """
    if path is None:
        return load_config(None)
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read device config: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    try:
        return load_config(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None

"""The device configuration shared by the scheduler extender, the webhook, the device plugin and `hami simulate`.

It is HAMi's `device-config.yaml` (hami-legacy-spec §4.2, ConfigMap `<fullname>-scheduler-device`) with the
same key names, so an existing ConfigMap works unchanged, plus two small additions: a `scheduler:` section
(default node / card policies, otherwise command-line flags in HAMi) and per-node overrides (`nodeconfig:`,
HAMi's per-node device-plugin JSON of §4.3). Unknown keys inside a section we implement are errors naming
the key (a typo must not silently fall back to a default); sections of vendors we do not implement yet are
accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from hami.errors import ConfigError

NODE_POLICIES = ("binpack", "spread")
CARD_POLICIES = ("binpack", "spread", "numa", "mutex", "topology-aware")
CORE_POLICIES = ("default", "force", "disable")

# HAMi top-level sections of vendors not implemented here: accepted, ignored.
_IGNORED_SECTIONS = {
    "cambricon", "metax", "mthreads", "iluvatars", "iluvatar", "enflame", "kunlun",
    "awsneuron", "amd", "vastai", "biren", "vnpus",
}  # fmt: skip


@dataclass(frozen=True)
class NvidiaConfig:
    """The `nvidia:` section. Memory in MiB, cores in percent, scaling factors are multipliers."""

    resourceCountName: str = "nvidia.com/gpu"
    resourceMemoryName: str = "nvidia.com/gpumem"
    resourceMemoryPercentageName: str = "nvidia.com/gpumem-percentage"
    resourceCoreName: str = "nvidia.com/gpucores"
    resourcePriorityName: str = "nvidia.com/priority"
    overwriteEnv: bool = False
    defaultMemory: int = 0
    defaultCores: int = 0
    defaultGPUNum: int = 1
    memoryFactor: int = 1
    preConfiguredDeviceMemory: int = 0
    deviceSplitCount: int = 10
    deviceMemoryScaling: float = 1.0
    deviceCoreScaling: float = 1.0
    enableNumaTopology: bool = False
    gpuCorePolicy: str = "default"
    libCudaLogLevel: int = 1
    runtimeClassName: str = ""
    disableCoreLimit: bool = False


@dataclass(frozen=True)
class HygonConfig:
    """The `hygon:` section (Hygon DCU)."""

    resourceCountName: str = "hygon.com/dcunum"
    resourceMemoryName: str = "hygon.com/dcumem"
    resourceCoreName: str = "hygon.com/dcucores"
    memoryFactor: int = 1


@dataclass(frozen=True)
class SchedulerConfig:
    """Default policies (HAMi: flags `--node-scheduler-policy` binpack, `--gpu-scheduler-policy` spread)."""

    nodeSchedulerPolicy: str = "binpack"
    gpuSchedulerPolicy: str = "spread"
    schedulerName: str = "hami-scheduler"


@dataclass(frozen=True)
class NodeOverride:
    """Per-node values (HAMi §4.3); None = use the `nvidia:` default."""

    name: str
    deviceSplitCount: int | None = None
    deviceMemoryScaling: float | None = None
    deviceCoreScaling: float | None = None


@dataclass(frozen=True)
class DeviceConfig:
    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)
    hygon: HygonConfig | None = field(default_factory=HygonConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    nodes: Mapping[str, NodeOverride] = field(default_factory=dict)

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


def _coerce(section: str, key: str, value: Any, typ: Any) -> Any:
    where = f"{section}.{key}"
    if typ in ("int", int):
        if isinstance(value, bool) or not isinstance(value, int):
            # HAMi's chart writes libCudaLogLevel as a string sometimes; accept integer strings.
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                return int(value)
            raise ConfigError(f"{where}: {value!r} must be an integer")
        return value
    if typ in ("float", float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: {value!r} must be a number")
        return float(value)
    if typ in ("bool", bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {value!r} must be true or false")
        return value
    if typ in ("str", str):
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {value!r} must be a string")
        return value
    raise AssertionError(typ)


def _section(cls: type, section: str, raw: Any, aliases: Mapping[str, str] | None = None) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: must be a mapping")
    known = {f.name: f.type for f in fields(cls)}
    # HAMi-only keys we accept but do not use (MIG is out of scope of hami-core legacy mode).
    tolerated = {"migProfileAllowlist", "knownMigGeometries", "migStrategy", "migstrategy"}
    kwargs = {}
    for key, value in raw.items():
        key = (aliases or {}).get(key, key)
        if key in tolerated:
            continue
        if key not in known:
            raise ConfigError(f"{section}.{key}: unknown key; valid keys: {', '.join(sorted(known))}")
        kwargs[key] = _coerce(section, key, value, known[key])
    return cls(**kwargs)


def _validate(cfg: DeviceConfig) -> None:
    n = cfg.nvidia
    checks = [
        (n.deviceSplitCount >= 1, "nvidia.deviceSplitCount", n.deviceSplitCount, "an integer >= 1"),
        (n.deviceMemoryScaling > 0, "nvidia.deviceMemoryScaling", n.deviceMemoryScaling, "a number > 0"),
        (n.deviceCoreScaling > 0, "nvidia.deviceCoreScaling", n.deviceCoreScaling, "a number > 0"),
        (n.defaultMemory >= 0, "nvidia.defaultMemory", n.defaultMemory, "MiB >= 0"),
        (0 <= n.defaultCores <= 100, "nvidia.defaultCores", n.defaultCores, "percent 0..100"),
        (n.defaultGPUNum >= 0, "nvidia.defaultGPUNum", n.defaultGPUNum, "an integer >= 0"),
        (n.memoryFactor >= 1, "nvidia.memoryFactor", n.memoryFactor, "an integer >= 1"),
        (n.gpuCorePolicy in CORE_POLICIES, "nvidia.gpuCorePolicy", n.gpuCorePolicy, ", ".join(CORE_POLICIES)),
    ]
    if cfg.hygon is not None:
        h = cfg.hygon
        checks.append((h.memoryFactor >= 1, "hygon.memoryFactor", h.memoryFactor, "an integer >= 1"))
    s = cfg.scheduler
    checks.append(
        (s.nodeSchedulerPolicy in NODE_POLICIES, "scheduler.nodeSchedulerPolicy", s.nodeSchedulerPolicy,
         ", ".join(NODE_POLICIES))
    )  # fmt: skip
    for part in s.gpuSchedulerPolicy.split(","):
        checks.append(
            (part.strip() in CARD_POLICIES, "scheduler.gpuSchedulerPolicy", s.gpuSchedulerPolicy,
             "a comma chain of " + ", ".join(CARD_POLICIES))
        )  # fmt: skip
    for o in cfg.nodes.values():
        if o.deviceSplitCount is not None and o.deviceSplitCount < 1:
            checks.append(
                (False, f"nodeconfig[{o.name}].devicesplitcount", o.deviceSplitCount, "an integer >= 1")
            )
        for key, val in (
            ("devicememoryscaling", o.deviceMemoryScaling),
            ("devicecorescaling", o.deviceCoreScaling),
        ):
            if val is not None and val <= 0:
                checks.append((False, f"nodeconfig[{o.name}].{key}", val, "a number > 0"))
    for ok, key, val, valid in checks:
        if not ok:
            raise ConfigError(f"{key}: {val!r} is invalid; valid: {valid}")


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
    keys = {"devicesplitcount": "deviceSplitCount", "devicememoryscaling": "deviceMemoryScaling",
            "devicecorescaling": "deviceCoreScaling"}  # fmt: skip
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"nodeconfig[{i}]: must be a mapping with a string 'name'")
        kw: dict[str, Any] = {}
        for k, v in entry.items():
            lk = k.lower()
            if lk == "name":
                continue
            if lk not in keys:
                # The rest of HAMi's per-node DP config (operatingmode, filterdevices, ...) is the plugin's.
                continue
            # HAMi: zero fields mean "not overridden".
            if v in (0, None):
                continue
            typ = int if lk == "devicesplitcount" else float
            kw[keys[lk]] = _coerce(f"nodeconfig[{i}]", k, v, typ)
        out[entry["name"]] = NodeOverride(name=entry["name"], **kw)
    return out


def load_config(data: Mapping[str, Any] | None) -> DeviceConfig:
    """Build a DeviceConfig from the parsed YAML mapping (None = all defaults). Raises ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("device config: top level must be a mapping")
    for key in data:
        if key not in {"nvidia", "hygon", "scheduler", "nodeconfig"} | _IGNORED_SECTIONS:
            raise ConfigError(
                f"{key}: unknown top-level key; valid: nvidia, hygon, scheduler, nodeconfig "
                f"and HAMi's other vendor sections ({', '.join(sorted(_IGNORED_SECTIONS))})"
            )
    cfg = DeviceConfig(
        nvidia=_section(NvidiaConfig, "nvidia", data.get("nvidia"), aliases={"defaultMem": "defaultMemory"}),
        hygon=_section(HygonConfig, "hygon", data.get("hygon")),
        scheduler=_section(SchedulerConfig, "scheduler", data.get("scheduler")),
        nodes=_node_overrides(data.get("nodeconfig")),
    )
    _validate(cfg)
    return cfg


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

"""Typed parsing of one device-config section into its dataclass.

Every section of HAMi's `device-config.yaml` (`nvidia:`, `cambricon:`, `vnpus:`, ...) is a frozen
dataclass next to the code that uses it (`hami/vendors/<vendor>.py`); this module turns the YAML
mapping into that dataclass with one rule set, so every section reports a typo or a wrong type the
same way: ``<section>.<key>: <value> must be an integer`` or ``<section>.<key>: unknown key; valid
keys: ...``. Kept apart from `hami.config` so vendor modules can use it without importing the
registry that imports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from hami.errors import ConfigError

#: HAMi's per-node key accepted inside a section too (copied there from `nodeconfig`) and not used:
#: `nvidia.migStrategy` and the per-node `migstrategy` are what the device plugin reads.
TOLERATED_KEYS = frozenset({"migstrategy"})


def coerce(section: str, key: str, value: Any, typ: Any) -> Any:
    """`value` as the field type `typ` (int, float, bool or str, also given as the annotation string).

    Raises ConfigError naming ``section.key``. Integer strings are accepted for ints (HAMi's chart
    writes `libCudaLogLevel` quoted); None becomes "" for strings.
    """
    where = f"{section}.{key}"
    if typ in ("int", int):
        if isinstance(value, bool) or not isinstance(value, int):
            # ASCII only, as Go's strconv (isdigit() also takes "²", which int() refuses)
            if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
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
    raise AssertionError(f"{where}: unsupported field type {typ!r}")


def parse_section(
    cls: type,
    section: str,
    raw: Any,
    *,
    aliases: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
) -> Any:
    """Build dataclass `cls` from the mapping `raw` (None = all defaults).

    Only scalar fields (int, float, bool, str) are read; `skip` names fields the caller parses itself
    (nested lists). `aliases` maps HAMi's alternative spellings to field names. Raises ConfigError for
    a non-mapping, an unknown key (listing the valid ones) or a wrongly typed value.
    """
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{section}: must be a mapping")
    skipped = set(skip)
    known = {f.name: f.type for f in fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        key = (aliases or {}).get(key, key)
        if key in TOLERATED_KEYS or key in skipped:
            continue
        if key not in known:
            raise ConfigError(f"{section}.{key}: unknown key; valid keys: {', '.join(sorted(known))}")
        kwargs[key] = coerce(section, key, value, known[key])
    return cls(**kwargs)


def require(ok: bool, key: str, value: Any, valid: str) -> None:
    """Raise ConfigError ``<key>: <value> is invalid; valid: <valid>`` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}: {value!r} is invalid; valid: {valid}")

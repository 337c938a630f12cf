"""NVIDIA MIG as HAMi schedules it: which profile and placement a container's device gets on a card in
MIG mode, and the allow-list of profiles per card model.

The rules are HAMi's dynamic MIG (pkg/device/nvidia: mig_topology.go, the MIG branches of
CustomFilterRule and AddResourceUsage), so the same cluster gets the same decision, byte for byte in
``hami.io/vgpu-mig-allocations``:

- a card registers the profiles the allow-list permits for its model, each with the placements NVML
  reports (`hami.model.MigProfile`);
- a request of M MiB takes the smallest profile (by memory, then by slices) whose memory is at least M
  and that has a placement overlapping no instance on the card: neither the existing ones nor those
  already decided for earlier devices of the same container;
- placements are tried from the highest start for the ``1g`` and ``3g`` profiles and from the lowest
  for the others (HAMi's "balanced packing": small instances fill the card from the top, so the large
  ones keep the bottom free);
- the device then books the profile's memory and cores, not the request's.

Pure: no I/O. Geometry of the cards themselves (profiles, placements, memory sizes) comes from NVML on
the node (the device plugin's discovery), never from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.errors import ConfigError
from hami.model import MigPlacement, MigProfile, MigSlot

#: Pod annotation (ours, beyond HAMi): every MIG device of the pod gets exactly this profile.
MIG_PROFILE = "nvidia.com/mig-profile"


@dataclass(frozen=True)
class MigProfileAllowlist:
    """One entry of `nvidia.migProfileAllowlist`: the MIG profiles cards of these models may offer."""

    models: tuple[str, ...] = ()
    """Substrings of the NVML card name (`A100-SXM4-40GB` matches `NVIDIA A100-SXM4-40GB`), HAMi's rule."""
    profiles: tuple[str, ...] = ()
    """Profile names as NVML prints them (`1g.10gb`, `3g.40gb`); memory, cores and placements come from
    NVML on the node."""


def profile_slices(name: str) -> str:
    """The compute-slice part of a profile name: ``3g.40gb`` -> ``3g`` (HAMi's profileSliceKey)."""
    head, dot, _ = name.partition(".")
    return head if dot and head else name


def valid_profile_name(name: str) -> bool:
    """HAMi's check of an allow-listed profile: ``<n>g.<anything>`` with at least one digit."""
    head, dot, _ = name.partition(".")
    return bool(dot) and len(head) >= 2 and head.endswith("g")


def validate_allowlist(
    entries: Sequence[MigProfileAllowlist], *, key: str = "nvidia.migProfileAllowlist"
) -> None:
    """Raise ConfigError naming the entry: every entry needs models and profiles, and every profile
    must look like ``1g.10gb`` (HAMi's ValidateMigProfileAllowlist)."""
    for i, e in enumerate(entries):
        if not e.models or not e.profiles:
            raise ConfigError(f"{key}[{i}]: needs both 'models' and 'profiles' (lists of strings)")
        for p in e.profiles:
            if not valid_profile_name(p):
                raise ConfigError(
                    f"{key}[{i}].profiles: {p!r} is not a MIG profile name; valid: e.g. 1g.10gb, 3g.40gb"
                )


def _strings(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) and x.strip() for x in raw):
        raise ConfigError(f"{where}: must be a list of non-empty strings")
    return tuple(x.strip() for x in raw)


def parse_allowlist(raw: Any, *, key: str = "nvidia.migProfileAllowlist") -> tuple[MigProfileAllowlist, ...]:
    """`migProfileAllowlist` (``[{models: [...], profiles: [...]}]``) from YAML. Raises ConfigError."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{key}: must be a list of {{models, profiles}}")
    out = []
    for i, entry in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: must be a mapping with 'models' and 'profiles'")
        unknown = set(entry) - {"models", "profiles"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key; valid keys: models, profiles")
        out.append(
            MigProfileAllowlist(
                models=_strings(entry.get("models", []), f"{where}.models"),
                profiles=_strings(entry.get("profiles", []), f"{where}.profiles"),
            )
        )
    validate_allowlist(out, key=key)
    return tuple(out)


def parse_known_geometries(
    raw: Any, *, key: str = "nvidia.knownMigGeometries"
) -> tuple[MigProfileAllowlist, ...]:
    """HAMi's older `knownMigGeometries` (``[{models, allowedGeometries: [[{name, memory, count, core}]]}]``)
    as allow-list entries: per entry the union of the profile names of its geometries, in the order they
    first appear (HAMi's migration rule). Memory, count and core of the old form are not used: NVML on
    the node reports them. Raises ConfigError naming the entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{key}: must be a list of {{models, allowedGeometries}}")
    out = []
    for i, entry in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: must be a mapping with 'models' and 'allowedGeometries'")
        unknown = set(entry) - {"models", "allowedGeometries"}
        if unknown:
            raise ConfigError(
                f"{where}.{sorted(unknown)[0]}: unknown key; valid keys: models, allowedGeometries"
            )
        geometries = entry.get("allowedGeometries", [])
        if not isinstance(geometries, list):
            raise ConfigError(f"{where}.allowedGeometries: must be a list of geometries (lists of profiles)")
        names: dict[str, None] = {}
        for g, geometry in enumerate(geometries):
            if not isinstance(geometry, list):
                raise ConfigError(
                    f"{where}.allowedGeometries[{g}]: must be a list of {{name, memory, count}}"
                )
            for t, template in enumerate(geometry):
                name = template.get("name") if isinstance(template, Mapping) else None
                if not isinstance(name, str) or not name.strip():
                    raise ConfigError(f"{where}.allowedGeometries[{g}][{t}]: needs a 'name' (a MIG profile)")
                names[name.strip()] = None
        out.append(MigProfileAllowlist(_strings(entry.get("models", []), f"{where}.models"), tuple(names)))
    validate_allowlist(out, key=key)
    return tuple(out)


def allowed_profiles(card_name: str, allowlist: Iterable[MigProfileAllowlist]) -> tuple[str, ...] | None:
    """The profiles the first allow-list entry naming this card's model permits (a model is a substring
    of the NVML name, HAMi's containsModel); None when no entry names the model."""
    for entry in allowlist:
        if any(m in card_name for m in entry.models):
            return entry.profiles
    return None


def profile_core(multiprocessors: int, full: int) -> int:
    """A profile's cores in percent of the card: its SMs x 100 / the whole card's, rounded up (HAMi)."""
    return (multiprocessors * 100 + full - 1) // full if full > 0 else 0


def _prefers_high(profile: str) -> bool:
    return profile.startswith(("1g.", "3g."))


def ordered_placements(profile: str, placements: Iterable[MigPlacement]) -> list[MigPlacement]:
    """Placements in the order they are tried: highest start first for 1g and 3g profiles, lowest
    first for the others (stable for equal starts)."""
    return sorted(placements, key=lambda p: -p.start if _prefers_high(profile) else p.start)


def free_placement(profile: MigProfile, occupied: Iterable[MigPlacement]) -> MigPlacement | None:
    """The first placement of `profile` (in `ordered_placements` order) overlapping none of `occupied`."""
    taken = tuple(occupied)
    for candidate in ordered_placements(profile.name, profile.placements):
        if not any(candidate.overlaps(o) for o in taken):
            return candidate
    return None


def choose(
    profiles: Sequence[MigProfile], occupied: Iterable[MigPlacement], memory: int, *, only: str = ""
) -> tuple[MigProfile, MigPlacement] | None:
    """The smallest profile of at least `memory` MiB (by memory, then slices) with a free placement,
    and that placement; with `only`, just that profile (an explicit choice). None when nothing fits."""
    taken = tuple(occupied)
    ranked = sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count))
    for p in ranked:
        if (only and p.name != only) or p.memory_mb < memory:
            continue
        placement = free_placement(p, taken)
        if placement is not None:
            return p, placement
    return None


def mig_text(slot: MigSlot) -> str:
    """``MIG 2g.10gb at slices 0-1``: a MIG instance as reports write it."""
    p = slot.placement
    return f"MIG {slot.profile} at slices {p.start}-{p.start + p.size - 1}"


def place_all(
    profiles: Sequence[MigProfile],
    occupied: Iterable[MigPlacement],
    memories: Sequence[int],
    *,
    only: str = "",
) -> list[tuple[MigProfile, MigPlacement]] | None:
    """`choose` for each memory in turn, each seeing the ones chosen before it (one container's
    devices on one card, or a card's devices in the order they are booked); None when one fails."""
    taken = list(occupied)
    out = []
    for m in memories:
        got = choose(profiles, taken, m, only=only)
        if got is None:
            return None
        out.append(got)
        taken.append(got[1])
    return out


__all__ = [
    "MIG_PROFILE",
    "MigProfileAllowlist",
    "allowed_profiles",
    "choose",
    "free_placement",
    "mig_text",
    "ordered_placements",
    "parse_allowlist",
    "parse_known_geometries",
    "place_all",
    "profile_core",
    "profile_slices",
    "valid_profile_name",
    "validate_allowlist",
]

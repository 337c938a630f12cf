"""The node registration codecs: what a node agent writes about its cards, in HAMi's wire formats.

`hami.io/node-nvidia-register` and the vendors' JSON registrations (hami-legacy-spec §1.6.1, with the
MIG profiles a card in MIG mode offers), the legacy colon form (§1.6.2) and the pair scores of
`hami.io/node-nvidia-score` (§1.6.3). A room of its own, apart from the annotation keys and the pod's
codecs (`hami.annotations`): these values are written by node agents, so every decoder here is bounded
(`hami.annotations.load_json`, `check_card_id`) and names the device and the field it rejects with
`AnnotationError`; encoders are byte for byte what HAMi's device plugins write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hami.annotations import (
    DEVICE_SEP,
    FIELD_SEP,
    check_card_id,
    decode_mig_placement,
    go_json,
    int_field,
    json_int,
    load_json,
)
from hami.errors import AnnotationError
from hami.model import Device, MigProfile

# ---------------------------------------------------------------------------------------------------
# Node registration, JSON form (§1.6.1).


def device_to_json(device: Device) -> dict[str, object]:
    """The registration object of one device, keys in HAMi's order, zero values omitted (omitempty)."""
    obj: dict[str, object] = {"id": device.uuid}
    for key, val in (
        ("index", device.index),
        ("count", device.count),
        ("devmem", device.devmem),
        ("devcore", device.devcore),
        ("type", device.type),
        ("numa", device.numa),
        ("mode", device.mode),
        ("migProfiles", [mig_profile_to_json(p) for p in device.mig_profiles]),
        ("health", device.health),
    ):
        if val:
            obj[key] = val
    return obj


def mig_profile_to_json(profile: MigProfile) -> dict[str, object]:
    """One MIG profile of a registration, HAMi's compact form (no key omitted; no placements = null)."""
    return {
        "name": profile.name,
        "memoryMB": profile.memory_mb,
        "core": profile.core,
        "sliceCount": profile.slice_count,
        "placements": [{"start": p.start, "size": p.size} for p in profile.placements] or None,
    }


def _mig_profiles(raw: object, where: str) -> tuple[MigProfile, ...]:
    """`migProfiles` of one registered device (unknown keys such as ``instanceCount`` ignored, as HAMi)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise AnnotationError(f"{where}: field 'migProfiles' must be a JSON array")
    out = []
    for j, obj in enumerate(raw):
        at = f"{where} migProfiles[{j}]"
        if not isinstance(obj, dict):
            raise AnnotationError(f"{at}: must be a JSON object")
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise AnnotationError(f"{at}: field 'name' must be a non-empty string")
        ints = {k: json_int(obj, k, at) for k in ("memoryMB", "core", "sliceCount")}
        if any(v < 0 for v in ints.values()):
            raise AnnotationError(f"{at}: memoryMB, core and sliceCount must be >= 0")
        places = obj.get("placements")
        if places is not None and not isinstance(places, list):
            raise AnnotationError(f"{at}: field 'placements' must be a JSON array")
        out.append(
            MigProfile(
                name=name,
                memory_mb=ints["memoryMB"],
                core=ints["core"],
                slice_count=ints["sliceCount"],
                placements=tuple(
                    decode_mig_placement(p, f"{at} placements[{k}]") for k, p in enumerate(places or ())
                ),
            )
        )
    return tuple(out)


def encode_node_devices_json(devices: Sequence[Device]) -> str:
    """`hami.io/node-nvidia-register` value: a compact JSON array as Go's encoder writes it."""
    return go_json([device_to_json(d) for d in devices])


def decode_node_devices_json(value: str, *, vendor: str = "NVIDIA") -> list[Device]:
    """Decode a JSON registration; missing `index`/`numa` mean 0 and a missing `health` means false.

    `migProfiles` (cards in MIG mode) become `Device.mig_profiles`; unknown keys (`devicevendor`,
    `custominfo`, a profile's `instanceCount`) are ignored. Raises AnnotationError for invalid JSON, a
    non-array, a device without `id`, or a field of the wrong type or range.
    """
    raw = load_json(value)
    if not isinstance(raw, list):
        raise AnnotationError("must be a JSON array of devices")
    out: list[Device] = []
    for i, obj in enumerate(raw):
        where = f"device {i}"
        if not isinstance(obj, dict):
            raise AnnotationError(f"{where}: must be a JSON object")
        uuid = obj.get("id")
        if not isinstance(uuid, str) or not uuid:
            raise AnnotationError(f"{where}: field 'id' must be a non-empty string")
        check_card_id(uuid, where)
        where = f"device {i} ({uuid})"
        ints = {k: json_int(obj, k, where) for k in ("index", "count", "devmem", "devcore", "numa")}
        for k in ("index", "count", "devmem", "devcore"):
            if ints[k] < 0:
                raise AnnotationError(f"{where}: field {k!r} must be >= 0, got {ints[k]}")
        dtype, mode, health = obj.get("type", ""), obj.get("mode", ""), obj.get("health", False)
        if not isinstance(dtype, str) or not isinstance(mode, str):
            raise AnnotationError(f"{where}: fields 'type' and 'mode' must be strings")
        if not isinstance(health, bool):
            raise AnnotationError(f"{where}: field 'health' must be true or false, got {health!r}")
        _check_memory(ints["devmem"], where)
        out.append(
            Device(
                uuid=uuid,
                index=ints["index"],
                count=ints["count"],
                devmem=ints["devmem"],
                devcore=ints["devcore"],
                type=dtype,
                numa=ints["numa"],
                mode=mode or "hami-core",
                health=health,
                vendor=vendor,
                mig_profiles=_mig_profiles(obj.get("migProfiles"), where),
            )
        )
    check_distinct_cards(out)
    return out


def _check_memory(devmem: int, where: str) -> None:
    if devmem == 0:
        # A card without memory cannot take any share; a plugin that registers one lost its NVML reading.
        raise AnnotationError(f"{where}: field 'devmem' must be > 0 MiB, got 0")


def check_distinct_cards(devices: Sequence[Device], *, indexes: bool = True) -> None:
    """Raise AnnotationError when two registered devices share an id or (with `indexes`) an index.

    A card listed twice would be handed twice to one container (a ``gpu: 2`` container got one 40000 MiB
    card twice, 60000 MiB booked on it); two cards of one index are one card seen twice, or a plugin
    bug, and kubelet's device ids could not tell them apart. Positions in the messages are 0-based.
    """
    ids: dict[str, int] = {}
    seen_index: dict[int, int] = {}
    for i, d in enumerate(devices):
        j = ids.setdefault(d.uuid, i)
        if j != i:
            raise AnnotationError(
                f"devices {j} and {i} both have id {d.uuid!r}; every card must be listed once"
            )
        j = seen_index.setdefault(d.index, i) if indexes else i
        if j != i:
            raise AnnotationError(
                f"devices {j} ({devices[j].uuid}) and {i} ({d.uuid}) both have index {d.index}; every card "
                "needs its own index"
            )


# ---------------------------------------------------------------------------------------------------
# Node registration, legacy colon form (§1.6.2): id,count,devmem,devcore,type,numa,health[,index,mode]:


def encode_node_devices_colon(devices: Sequence[Device]) -> str:
    """The 9-field colon form HAMi's encoder writes: ``id,count,devmem,devcore,type,numa,health,index,mode:``."""
    return "".join(
        f"{d.uuid},{d.count},{d.devmem},{d.devcore},{d.type},{d.numa},{str(d.health).lower()},"
        f"{d.index},{d.mode}{DEVICE_SEP}"
        for d in devices
    )


_BOOLS = {"1": True, "t": True, "T": True, "true": True, "TRUE": True, "True": True}
_BOOLS.update({"0": False, "f": False, "F": False, "false": False, "FALSE": False, "False": False})


def decode_node_devices_colon(value: str, *, vendor: str) -> list[Device]:
    """Decode the colon form; 7 fields (index 0, mode hami-core) or 9. Raises AnnotationError otherwise.

    A value without any ``:`` is an error (HAMi: "node annotations not decode successfully").
    """
    if DEVICE_SEP not in value:
        raise AnnotationError("colon registration format needs ':' after every device")
    out: list[Device] = []
    indexed = True
    for i, frag in enumerate(value.split(DEVICE_SEP)):
        if not frag.strip():
            continue
        f = frag.split(FIELD_SEP)
        where = f"device {i}"
        if len(f) not in (7, 9):
            raise AnnotationError(
                f"{where}: {len(f)} fields, want 7 (id,count,devmem,devcore,type,numa,health) or 9 (+index,mode)"
            )
        if f[6] not in _BOOLS:
            raise AnnotationError(f"{where}: health {f[6]!r} is not a boolean (true/false)")
        if not f[0].strip():
            raise AnnotationError(f"{where}: empty id")
        check_card_id(f[0], where)
        ints = {
            k: int_field(f[j], what=f"{where} {k}") for j, k in ((1, "count"), (2, "devmem"), (3, "devcore"))
        }
        ints["index"] = int_field(f[7], what=f"{where} index") if len(f) == 9 else 0
        for k, v in ints.items():
            if v < 0:
                raise AnnotationError(f"{where}: field {k!r} must be >= 0, got {v}")
        _check_memory(ints["devmem"], f"{where} ({f[0]})")
        out.append(
            Device(
                uuid=f[0],
                count=ints["count"],
                devmem=ints["devmem"],
                devcore=ints["devcore"],
                type=f[4],
                numa=int_field(f[5], what=f"{where} numa"),
                health=_BOOLS[f[6]],
                index=ints["index"],
                mode=(f[8] if len(f) == 9 and f[8] else "hami-core"),
                vendor=vendor,
            )
        )
        indexed = indexed and len(f) == 9
    # The 7-field form carries no index (every card reads as index 0), so only ids are compared there.
    check_distinct_cards(out, indexes=indexed)
    return out


# ---------------------------------------------------------------------------------------------------
# Pair scores (`hami.io/node-nvidia-score`, §1.6.3).


def decode_pair_scores(value: str) -> dict[str, dict[str, int]]:
    """``[{"uuid":"GPU-a","score":{"GPU-b":220}}]`` -> ``{"GPU-a": {"GPU-b": 220}}``. Raises AnnotationError."""
    raw = load_json(value)
    if not isinstance(raw, list):
        raise AnnotationError("must be a JSON array of {uuid, score}")
    out: dict[str, dict[str, int]] = {}
    for i, obj in enumerate(raw):
        if not isinstance(obj, dict) or not isinstance(obj.get("uuid"), str):
            raise AnnotationError(f"entry {i}: must be an object with a string 'uuid'")
        score = obj.get("score") or {}
        if not isinstance(score, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in score.values()
        ):
            raise AnnotationError(f"entry {i} ({obj['uuid']}): 'score' must map UUIDs to integers")
        out[obj["uuid"]] = dict(score)
    return out


def encode_pair_scores(scores: Mapping[str, Mapping[str, int]]) -> str:
    """Inverse of `decode_pair_scores`."""
    return go_json([{"uuid": u, "score": dict(s)} for u, s in scores.items()])

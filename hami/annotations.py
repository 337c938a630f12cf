"""Every annotation and label key, and the codecs of HAMi's wire formats.

HAMi parses its positional strings in several places and silently turns bad numbers into 0; here each
format is parsed in exactly one function, with round-trip tests on the worked examples of
hami-legacy-spec §1.6, and a malformed value raises `AnnotationError` naming the entry and the field.
Encoders are byte-for-byte what HAMi writes, so vendor device plugins, HAMi-core and dashboards keep
working against our annotations.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from hami import objects
from hami.errors import AnnotationError
from hami.model import ContainerDevice, Device, MigPlacement, MigProfile

# Pod annotations written by the scheduler and the device plugin (§1.4).
ASSIGNED_NODE = "hami.io/vgpu-node"  # annotation and label
ASSIGNED_TIME = "hami.io/vgpu-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
NVIDIA_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
NVIDIA_ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
SCHEDULER_ROLE = "hami.io/scheduler-role"  # label on scheduler pods

# Pod annotations set by users (§1.3).
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
WEBHOOK_IGNORE = "hami.io/webhook"  # label value "ignore" on a pod or namespace

# Node annotations (§1.5).
NODE_LOCK = "hami.io/mutex.lock"
# Written with the node lock by this project's extender (HAMi's components ignore it): the UID of the
# pod the lock was taken for and a digest of the allocation decided for it, on the Node, which pod
# owners cannot write. The device plugin serves the lock holder only when both match (see
# `AllocationStamp`).
NODE_LOCK_ALLOCATION = "hami.io/mutex.lock-allocation"
DEVICE_CORDON = "hami.io/device-cordon"
NVIDIA_REGISTER = "hami.io/node-nvidia-register"
NVIDIA_HANDSHAKE = "hami.io/node-handshake"
NVIDIA_SCORE = "hami.io/node-nvidia-score"

# Separators of the pod device list (§1.6.4) and the colon registration format (§1.6.2).
CONTAINER_SEP = ";"
DEVICE_SEP = ":"
FIELD_SEP = ","

#: The most bytes a registration may hold: Kubernetes' limit on all of an object's annotations together
#: (256 KiB, TotalAnnotationSizeLimitB); a larger value cannot come from a real node.
MAX_REGISTRATION_BYTES = 256 * 1024
#: The deepest nesting of arrays and objects a registration may have. HAMi's deepest (a vendor's device
#: objects with their custom info) is 4; Python's JSON decoder recurses once per level and fails with a
#: RecursionError near 1000.
MAX_JSON_DEPTH = 16
#: The longest card id accepted (NVML UUIDs are 40 characters, MIG ones up to 47).
MAX_CARD_ID = 128


class BindPhase(StrEnum):
    """Values of `hami.io/bind-phase` (§2.8)."""

    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


# ---------------------------------------------------------------------------------------------------
# Pod device lists: "uuid,NVIDIA,3000,30:" per device, ";" after every container (§1.6.4).


def encode_container_devices(devices: Sequence[ContainerDevice]) -> str:
    """One container's devices, each ``uuid,type,usedmem,usedcores:`` (MiB, percent)."""
    return "".join(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}{DEVICE_SEP}" for d in devices)


def encode_pod_devices(containers: Sequence[Sequence[ContainerDevice]]) -> str:
    """The pod device list: one ``;``-terminated entry per container, init containers first.

    A container without devices is an empty entry, so ``[[], [d]]`` encodes as ``;uuid,NVIDIA,3000,30:;``.
    """
    return "".join(encode_container_devices(c) + CONTAINER_SEP for c in containers)


def _int_field(value: str, *, what: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise AnnotationError(f"{what}: {value!r} is not an integer") from None


def decode_container_devices(value: str, *, entry: int = 0) -> list[ContainerDevice]:
    """Decode one container entry (without its ``;``).

    An id may hold ``:`` (PCI bus ids): the pieces up to the one with the fields are joined back. Pieces
    without a comma after the last device are ignored (HAMi writes none, but tolerates them), and so is the empty
    device ``,,0,0`` that some HAMi versions wrote for a container without devices (HAMi#991: the
    device plugin then failed with "unknown uuid"). A device with fewer than 4 fields, an empty uuid
    with a type or usage, or a non-integer memory/cores field raises AnnotationError naming the entry.
    """
    out: list[ContainerDevice] = []
    prefix = ""
    for n, frag in enumerate(value.split(DEVICE_SEP)):
        if FIELD_SEP not in frag:
            # Part of an id that holds ':' (a PCI bus id such as Kunlun's 0000:1a:00.0): the device ends
            # at the ':' after its integer fields, so the pieces before the next comma are its id's.
            prefix += frag + DEVICE_SEP
            continue
        frag, prefix = prefix + frag, ""
        parts = frag.split(FIELD_SEP)
        if len(parts) < 4:
            raise AnnotationError(
                f"container entry {entry}, device {n}: {frag!r} has {len(parts)} fields, want "
                "uuid,type,usedmem,usedcores"
            )
        uuid = parts[0].strip()
        if not uuid and not parts[1].strip() and all(p.strip() in ("", "0") for p in parts[2:]):
            continue  # HAMi's empty-device form of an empty container entry
        try:
            # The common case in one step: a relist decodes every live pod's list (70,000 at 10,000 nodes).
            mem, cores = int(parts[2]), int(parts[3])
        except ValueError:
            mem = cores = -1
        if not uuid or mem < 0 or cores < 0:
            where = f"container entry {entry}, device {n}"
            if not uuid:
                raise AnnotationError(f"{where}: empty uuid")
            mem = _int_field(parts[2], what=f"{where} usedmem")
            cores = _int_field(parts[3], what=f"{where} usedcores")
            if mem < 0 or cores < 0:
                raise AnnotationError(f"{where}: usedmem and usedcores must be >= 0, got {mem} and {cores}")
        out.append(ContainerDevice(uuid=uuid, type=parts[1].strip(), usedmem=mem, usedcores=cores))
    return out


def decode_pod_devices(value: str) -> list[list[ContainerDevice]]:
    """Decode a pod device list into one list per container (empty entries kept, index = container).

    ``""`` is no containers; the final ``;`` terminates the last entry rather than starting a new one
    (HAMi's own decoder yields a spurious trailing entry there). Raises AnnotationError.
    """
    if not value:
        return []
    body = value[:-1] if value.endswith(CONTAINER_SEP) else value
    return [decode_container_devices(e, entry=i) for i, e in enumerate(body.split(CONTAINER_SEP))]


def align_pod_devices(
    entries: Sequence[Sequence[ContainerDevice]], containers: int
) -> list[list[ContainerDevice]]:
    """Map a decoded pod device list onto `containers` containers (init first), tolerating HAMi's variants.

    HAMi's padding regression (hami-legacy-spec §8.2, HAMi#2899) drops the leading empty entries of
    containers without devices, so a list shorter than the pod has containers belongs to the *last*
    containers: it is padded with empty entries in front. Some versions wrote an extra leading ``;``
    (HAMi#991): surplus leading entries that are empty are dropped. A list that cannot be aligned this
    way (surplus entries holding devices) is returned unchanged. Shape: one list per container.
    """
    out = [list(e) for e in entries]
    if not out:
        return out
    if len(out) < containers:
        return [[] for _ in range(containers - len(out))] + out
    while len(out) > containers and not out[0]:
        out.pop(0)
    return out


# ---------------------------------------------------------------------------------------------------
# Bounded decoding of what node agents write: size, depth and the card id alphabet.


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|["\[\]{}]', re.DOTALL)


def load_json(
    value: str, *, max_bytes: int = MAX_REGISTRATION_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> object:
    """`json.loads(value)` for a value a node agent wrote, bounded before it is parsed.

    Raises AnnotationError when `value` is longer than `max_bytes` bytes (UTF-8), nests arrays and
    objects deeper than `max_depth`, or is not valid JSON. The depth is counted in one pass over the
    text (brackets inside strings do not count), so no input reaches the recursive decoder deeper
    than the bound.
    """
    if len(value) > max_bytes or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise AnnotationError(f"longer than {max_bytes} bytes")
    if value.count("[") + value.count("{") > max_depth:  # fewer cannot nest deeper than the bound
        _scan_depth(value, max_depth)
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as e:
        raise AnnotationError(f"not valid JSON: {e}") from None


def _scan_depth(value: str, max_depth: int) -> int:
    """The nesting left open at the end of `value`; raises AnnotationError beyond `max_depth`.

    Walked token by token (whole strings, whose brackets do not nest, and brackets), not character
    by character: a 10,000-node relist reads 10,000 registrations. Linear: a string without its
    closing quote is matched as a lone quote, and everything after it is inside it."""
    depth = 0
    for match in _JSON_TOKENS.finditer(value):
        token = match[0]
        if token[0] == '"':
            if len(token) == 1:
                break
        elif token in "[{":
            depth += 1
            if depth > max_depth:
                raise AnnotationError(f"nested deeper than {max_depth} levels of arrays and objects")
        else:
            depth -= 1
    return depth


#: ``:`` is not among them: HAMi's Kunlun ids are PCI bus ids (``0000:1a:00.0``), and the device list
#: decoder joins such an id back together (a device ends at the ``:`` after its integer fields).
_CARD_ID_SEPARATORS = (FIELD_SEP, CONTAINER_SEP)


def check_card_id(uuid: str, where: str) -> None:
    """Raise AnnotationError when `uuid` cannot travel in HAMi's wire formats unchanged.

    A card id is written into pod device lists (``uuid,type,mem,cores:`` per device, ``;`` per
    container) and kubelet's device ids, and read back by splitting on ``,`` and ``;``; an id holding
    one of them decodes as another card after a restart, which then takes a second pod. HAMi's
    alphabet is printable ASCII without white space, ``,`` or ``;``, at most `MAX_CARD_ID` characters.
    """
    if len(uuid) > MAX_CARD_ID:
        raise AnnotationError(f"{where}: id is longer than {MAX_CARD_ID} characters")
    for ch in uuid:
        if ch in _CARD_ID_SEPARATORS:
            raise AnnotationError(
                f"{where}: id {uuid!r} holds {ch!r}, a separator of HAMi's device lists; valid: printable "
                "ASCII without white space, ',' or ';'"
            )
        if not "!" <= ch <= "~":
            raise AnnotationError(
                f"{where}: id {uuid!r} holds {ch!r}; valid: printable ASCII without white space, ',' or ';'"
            )


def check_card_ids(devices: Sequence[Device]) -> None:
    """`check_card_id` for every device (positions 0-based in the messages). Raises AnnotationError."""
    for i, d in enumerate(devices):
        check_card_id(d.uuid, f"device {i}")


# ---------------------------------------------------------------------------------------------------
# MIG allocations (`hami.io/vgpu-mig-allocations`, §1.6.6): the scheduler's reservation of one MIG
# instance per device of a container on a card in MIG mode; the device plugin adds the runtime identity.


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One entry of ``hami.io/vgpu-mig-allocations`` (HAMi's MigAllocation).

    `container_index` counts the pod's containers in device-list order (init containers first),
    `device_index` the container's devices; `gpu_uuid` is the parent card. The runtime fields
    (`mig_uuid`, `gpu_instance_id`, `compute_instance_id`) are all set or all unset.
    """

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def realized(self) -> bool:
        """Whether the device plugin recorded the instance it created (the runtime fields are set)."""
        return (
            bool(self.mig_uuid) and self.gpu_instance_id is not None and self.compute_instance_id is not None
        )

    def to_json(self) -> dict[str, object]:
        obj: dict[str, object] = {
            "containerIndex": self.container_index,
            "deviceIndex": self.device_index,
            "gpuUUID": self.gpu_uuid,
            "profile": self.profile,
            "placement": {"start": self.placement.start, "size": self.placement.size},
        }
        # Go's omitempty: an empty string and a nil pointer are left out; a zero instance id is not.
        if self.mig_uuid:
            obj["migUUID"] = self.mig_uuid
        if self.gpu_instance_id is not None:
            obj["gpuInstanceID"] = self.gpu_instance_id
        if self.compute_instance_id is not None:
            obj["computeInstanceID"] = self.compute_instance_id
        return obj


def encode_mig_allocations(allocations: Sequence[MigAllocation]) -> str:
    """The annotation value as Go's encoder writes HAMi's list (compact, keys in HAMi's order)."""
    return _go_json([a.to_json() for a in allocations])


def mig_reservations(value: str) -> str:
    """``hami.io/vgpu-mig-allocations`` without the runtime fields the device plugin adds at Allocate:
    what the scheduler decided, in the scheduler's encoding (what the node lock's stamp digests).
    Raises AnnotationError as `decode_mig_allocations`."""
    return encode_mig_allocations(
        [MigAllocation(a.container_index, a.device_index, a.gpu_uuid, a.profile, a.placement)
         for a in decode_mig_allocations(value)]
    )  # fmt: skip


def mig_allocations_of(containers: Sequence[Sequence[ContainerDevice]]) -> list[MigAllocation]:
    """The reservations of a pod's device lists (one list per container, init first): one entry per
    device with a MIG instance decided, in container then device order (HAMi's EncodeMigAllocations)."""
    return [
        MigAllocation(i, j, cd.uuid, cd.mig.profile, cd.mig.placement)
        for i, cds in enumerate(containers)
        for j, cd in enumerate(cds)
        if cd.mig is not None and cd.mig.profile and cd.mig.placement.size
    ]


def _uint_or_none(obj: Mapping[str, object], key: str, where: str) -> int | None:
    val = obj.get(key)
    if val is None:
        return None
    if isinstance(val, bool) or not isinstance(val, int) or val < 0:
        raise AnnotationError(f"{where}: field {key!r} must be an integer >= 0, got {val!r}")
    return val


def decode_mig_allocations(value: str) -> list[MigAllocation]:
    """Decode ``hami.io/vgpu-mig-allocations`` (``""`` = none), checked as HAMi checks it.

    Raises AnnotationError for invalid JSON (also: longer than 256 KiB, nested deeper than 16 levels),
    an entry without container/device index, card, profile or placement ("incomplete"), an entry with only part of the runtime identity, or two entries for
    the same container and device.
    """
    if not value:
        return []
    # Bounded: the value is the pod owner's to write where nothing refuses it, and a deeply nested
    # one would otherwise raise RecursionError in every reader (extender, device plugin, monitor).
    raw = load_json(value)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise AnnotationError("must be a JSON array of MIG allocations")
    out: list[MigAllocation] = []
    seen: set[tuple[int, int]] = set()
    for i, obj in enumerate(raw):
        where = f"MIG allocation {i}"
        if not isinstance(obj, dict):
            raise AnnotationError(f"{where}: must be a JSON object")
        ci, di = _json_int(obj, "containerIndex", where), _json_int(obj, "deviceIndex", where)
        gpu, profile = obj.get("gpuUUID", ""), obj.get("profile", "")
        mig_uuid = obj.get("migUUID", "")
        if not isinstance(gpu, str) or not isinstance(profile, str) or not isinstance(mig_uuid, str):
            raise AnnotationError(f"{where}: fields 'gpuUUID', 'profile' and 'migUUID' must be strings")
        placement = _mig_placement(obj.get("placement") or {}, f"{where} placement")
        if ci < 0 or di < 0 or not gpu or not profile or placement.size == 0:
            raise AnnotationError(
                f"{where} is incomplete: it needs containerIndex and deviceIndex >= 0, gpuUUID, profile and "
                "a placement of size > 0"
            )
        gi = _uint_or_none(obj, "gpuInstanceID", where)
        cid = _uint_or_none(obj, "computeInstanceID", where)
        if sum((bool(mig_uuid), gi is not None, cid is not None)) not in (0, 3):
            raise AnnotationError(
                f"{where} has a partial runtime identity: migUUID, gpuInstanceID and computeInstanceID go together"
            )
        if (ci, di) in seen:
            raise AnnotationError(f"duplicate MIG allocation for container {ci} device {di}")
        seen.add((ci, di))
        out.append(MigAllocation(ci, di, gpu, profile, placement, mig_uuid, gi, cid))
    return out


# ---------------------------------------------------------------------------------------------------
# Node registration, JSON form (§1.6.1).


def _go_json(obj: object) -> str:
    # Go's encoding/json escapes <, > and & (and U+2028/9) even in plain strings; match it byte for byte.
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return (
        s.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


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


def _mig_placement(obj: object, where: str) -> MigPlacement:
    if not isinstance(obj, dict):
        raise AnnotationError(f"{where}: must be an object {{start, size}}")
    start, size = _json_int(obj, "start", where), _json_int(obj, "size", where)
    if start < 0 or size < 0:
        raise AnnotationError(f"{where}: start and size must be >= 0, got {start} and {size}")
    return MigPlacement(start, size)


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
        ints = {k: _json_int(obj, k, at) for k in ("memoryMB", "core", "sliceCount")}
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
                    _mig_placement(p, f"{at} placements[{k}]") for k, p in enumerate(places or ())
                ),
            )
        )
    return tuple(out)


def encode_node_devices_json(devices: Sequence[Device]) -> str:
    """`hami.io/node-nvidia-register` value: a compact JSON array as Go's encoder writes it."""
    return _go_json([device_to_json(d) for d in devices])


def _json_int(obj: Mapping[str, object], key: str, where: str) -> int:
    val = obj.get(key, 0)
    if isinstance(val, bool) or not isinstance(val, int):
        raise AnnotationError(f"{where}: field {key!r} must be an integer, got {val!r}")
    return val


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
        ints = {k: _json_int(obj, k, where) for k in ("index", "count", "devmem", "devcore", "numa")}
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
            k: _int_field(f[j], what=f"{where} {k}") for j, k in ((1, "count"), (2, "devmem"), (3, "devcore"))
        }
        ints["index"] = _int_field(f[7], what=f"{where} index") if len(f) == 9 else 0
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
                numa=_int_field(f[5], what=f"{where} numa"),
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
    return _go_json([{"uuid": u, "score": dict(s)} for u, s in scores.items()])


# ---------------------------------------------------------------------------------------------------
# Node lock (`hami.io/mutex.lock`, §1.6.5).


@dataclass(frozen=True, slots=True)
class NodeLock:
    """A parsed lock value; `namespace`/`name` are None in the legacy time-only form."""

    time: datetime
    namespace: str | None = None
    name: str | None = None


def format_rfc3339(t: datetime) -> str:
    """Go's time.RFC3339 (seconds, ``Z`` for UTC, ``+08:00`` otherwise); naive times are taken as UTC."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    s = t.replace(microsecond=0).isoformat()
    return s[:-6] + "Z" if s.endswith("+00:00") else s


def encode_node_lock(lock: NodeLock) -> str:
    """``2024-05-10T16:15:30+08:00,default,gpu-pod`` (or just the time for an owner-less lock)."""
    if lock.namespace is None or lock.name is None:
        return format_rfc3339(lock.time)
    return f"{format_rfc3339(lock.time)},{lock.namespace},{lock.name}"


def decode_node_lock(value: str) -> NodeLock:
    """Parse a lock value: no comma = legacy time-only, otherwise exactly 3 parts. Raises AnnotationError."""
    parts = value.split(",")
    if len(parts) not in (1, 3):
        raise AnnotationError(f"lock value {value!r}: want '<RFC3339>,<namespace>,<name>' or '<RFC3339>'")
    try:
        t = datetime.fromisoformat(parts[0].strip())
    except ValueError:
        raise AnnotationError(f"lock value {value!r}: time {parts[0]!r} is not RFC3339") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    if len(parts) == 1:
        return NodeLock(time=t)
    if not parts[1] or not parts[2]:
        raise AnnotationError(f"lock value {value!r}: empty namespace or pod name")
    return NodeLock(time=t, namespace=parts[1], name=parts[2])


# ---------------------------------------------------------------------------------------------------
# The node lock's allocation stamp (`hami.io/mutex.lock-allocation`).


@dataclass(frozen=True, slots=True)
class AllocationStamp:
    """Whom the node lock was taken for and what was decided for it: the pod's UID and, per allocation
    annotation key, the SHA-256 (hex) of the value the scheduler wrote."""

    uid: str
    digests: Mapping[str, str]

    def matches(self, key: str, value: str | None) -> bool:
        """Whether `value` of annotation `key` is what the scheduler wrote (False when not stamped)."""
        want = self.digests.get(key)
        return want is not None and value is not None and want == digest(value)


def digest(value: str) -> str:
    """SHA-256 (hex) of an annotation value, as `AllocationStamp` holds it."""
    return hashlib.sha256(value.encode()).hexdigest()


def encode_allocation_stamp(uid: str, allocations: Mapping[str, str]) -> str:
    """``{"uid":"<uid>","sha256":{"<key>":"<hex>",...}}`` for the allocation annotations decided."""
    return json.dumps(
        {"uid": uid, "sha256": {k: digest(v) for k, v in sorted(allocations.items())}}, separators=(",", ":")
    )


def decode_allocation_stamp(value: str) -> AllocationStamp:
    """Parse a stamp. Raises AnnotationError for anything but `encode_allocation_stamp`'s shape."""
    raw = load_json(value, max_bytes=4096, max_depth=2)
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("uid"), str)
        or not raw["uid"]
        or not isinstance(raw.get("sha256"), dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw["sha256"].items())
    ):
        raise AnnotationError('want {"uid": "<pod uid>", "sha256": {"<annotation>": "<hex>"}}')
    return AllocationStamp(uid=raw["uid"], digests=dict(raw["sha256"]))


# ---------------------------------------------------------------------------------------------------
# Handshake (`hami.io/node-handshake*`, §1.6.7).

HANDSHAKE_REQUESTING = "Requesting"
HANDSHAKE_REPORTED = "Reported"
HANDSHAKE_DELETED = "Deleted"
_HANDSHAKE_TIME = "%Y-%m-%d %H:%M:%S"  # Go's time.DateTime layout


@dataclass(frozen=True, slots=True)
class Handshake:
    """A parsed handshake: `state` is Requesting / Reported / Deleted / the raw prefix; `time` if parseable."""

    state: str
    time: datetime | None


def encode_handshake(state: str, t: datetime) -> str:
    """``Requesting_2024-05-10 16:15:30`` (Go DateTime layout, the writer's clock, no zone)."""
    return f"{state}_{t.strftime(_HANDSHAKE_TIME)}"


def decode_handshake(value: str) -> Handshake:
    """Parse a handshake; never raises: an unparseable time gives ``time=None`` (a stale marker)."""
    state, _, rest = value.partition("_")
    try:
        t: datetime | None = datetime.strptime(rest.strip(), _HANDSHAKE_TIME)
    except ValueError:
        t = None
    return Handshake(state=state, time=t)


# ---------------------------------------------------------------------------------------------------
# Small helpers for objects in the API's JSON form.


def pod_annotations(pod: Mapping[str, object]) -> dict[str, str]:
    """`metadata.annotations` of a pod or node dict, `{}` when absent."""
    return dict(objects.annotations(pod))

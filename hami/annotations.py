"""Every annotation and label key, and the codecs of HAMi's wire formats but the node registrations.

Here: the pod device lists, MIG allocations, the node lock and its allocation stamp, the handshake,
and the bounded decoding every node agent's value goes through (`load_json`, `check_card_id`). The
registrations a node agent writes about its cards (JSON and colon forms, pair scores) are their own
room, `hami.registration`, built on these helpers.

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
from hami.model import ContainerDevice, Device, MigPlacement

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


def int_field(value: str, *, what: str) -> int:
    """One integer field of a positional wire format (blanks around it allowed). Raises AnnotationError
    naming `what`."""
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
            mem = int_field(parts[2], what=f"{where} usedmem")
            cores = int_field(parts[3], what=f"{where} usedcores")
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
# Bounded decoding of what node agents write (size, depth, the card id alphabet), and JSON as Go writes it.


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


def go_json(obj: object) -> str:
    """`obj` as compact JSON, byte for byte as Go's encoding/json writes it: Go escapes <, > and & (and
    U+2028/9) even in plain strings."""
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return (
        s.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def json_int(obj: Mapping[str, object], key: str, where: str) -> int:
    """`obj[key]` as an integer (absent = 0). Raises AnnotationError naming `where` and the field otherwise."""
    val = obj.get(key, 0)
    if isinstance(val, bool) or not isinstance(val, int):
        raise AnnotationError(f"{where}: field {key!r} must be an integer, got {val!r}")
    return val


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


def decode_mig_placement(obj: object, where: str) -> MigPlacement:
    """A placement object ``{"start": 0, "size": 2}`` (MIG allocations, registered MIG profiles).
    Raises AnnotationError naming `where` for another shape or a negative number."""
    if not isinstance(obj, dict):
        raise AnnotationError(f"{where}: must be an object {{start, size}}")
    start, size = json_int(obj, "start", where), json_int(obj, "size", where)
    if start < 0 or size < 0:
        raise AnnotationError(f"{where}: start and size must be >= 0, got {start} and {size}")
    return MigPlacement(start, size)


def encode_mig_allocations(allocations: Sequence[MigAllocation]) -> str:
    """The annotation value as Go's encoder writes HAMi's list (compact, keys in HAMi's order)."""
    return go_json([a.to_json() for a in allocations])


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
        ci, di = json_int(obj, "containerIndex", where), json_int(obj, "deviceIndex", where)
        gpu, profile = obj.get("gpuUUID", ""), obj.get("profile", "")
        mig_uuid = obj.get("migUUID", "")
        if not isinstance(gpu, str) or not isinstance(profile, str) or not isinstance(mig_uuid, str):
            raise AnnotationError(f"{where}: fields 'gpuUUID', 'profile' and 'migUUID' must be strings")
        placement = decode_mig_placement(obj.get("placement") or {}, f"{where} placement")
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

"""Readers of the per-container shared accounting files: libvgpu's layout 2.x and HAMi-core's v1 and v0.

Why a reader of our own instead of mapping the file: a shared mapping of a file that another process
truncates raises SIGBUS in the reader, which would kill the monitor. Every read here is a `pread` of
the few byte ranges that matter (header, device table, the in-use slots), so a truncated or shrinking
file gives a short read and a `RegionError`, never a signal. Nothing is locked and nothing is written:
a container is never blocked or slowed by the monitor.

Layouts (little endian, x86-64):

* libvgpu 2.x (``libvgpu/include/vgpu_region.h``, docs/libvgpu.md "Shared region"): magic
  ``0x55504756`` at 0, major 2; header 4096 B, 16 device entries of 256 B at 4096, 1024 slots of
  576 B at 8192; total 598,016 B. Usage of device ``d`` = sum of ``used[d]`` over live slots below
  ``slot_hwm``.
* HAMi-core ``shared_region_t`` v1 (2,008,952 B) and v0 (1,197,896 B): int32 magic ``19920718`` at 0;
  v1 when ``majorVersion == 1`` at offset 4 and the file is at least the v1 size, v0 when the size is
  in [v0 size, v1 size). Only the first ``procnum`` slots count, and only those whose ``status`` is
  non-zero and whose process is alive.

A file that is shorter than its layout, carries an unknown magic or version, has header fields that
disagree with the layout, or changes size while it is read raises `RegionError` with one of
`REASONS`; the caller counts it in ``hami_monitor_cache_errors_total{reason}``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Protocol

# -- libvgpu 2.x ---------------------------------------------------------------------------------
VGPU_MAGIC = 0x55504756  # bytes "VGPU" in file order
VGPU_MAJOR = 2
VGPU_HEADER_SIZE, VGPU_DEVICE_SIZE, VGPU_SLOT_SIZE = 4096, 256, 576
VGPU_MAX_DEVICES, VGPU_MAX_SLOTS = 16, 1024
VGPU_DEVICES_AT = VGPU_HEADER_SIZE
VGPU_SLOTS_AT = VGPU_HEADER_SIZE + VGPU_MAX_DEVICES * VGPU_DEVICE_SIZE
VGPU_REGION_SIZE = VGPU_SLOTS_AT + VGPU_MAX_SLOTS * VGPU_SLOT_SIZE  # 598,016
VGPU_UNLIMITED = (1 << 64) - 1
VGPU_DEVICE_READY = 2
_VGPU_HEADER = struct.Struct("<8I2I")  # magic, major, minor, 3 sizes, 2 maxima, device_count, slot_hwm
# uuid[96], limit_bytes, sm_limit, phys_index, state, pad, pause_until, covered_until, busy, last_kernel
_VGPU_DEVICE = struct.Struct("<96sQIIII3QQ")
# pid, hostpid, start_time, used[16], data[16], context[16], module[16]
_VGPU_SLOT = struct.Struct("<iiQ16Q16Q16Q16Q")

# -- HAMi-core shared_region_t --------------------------------------------------------------------
HAMI_MAGIC = 19920718
HAMI_MAX_DEVICES, HAMI_MAX_PROCS = 16, 1024
HAMI_UUID_SIZE = 96
HAMI_UUID_LABEL = 40  # the monitor's label is the first 40 bytes of the uuid slot ("GPU-" + 36)


@dataclass(frozen=True)
class _HamiLayout:
    """Offsets of one HAMi-core layout; `mem_stride`/`util_stride` are the inner struct sizes."""

    name: str
    size: int
    num_at: int
    uuids_at: int
    limit_at: int
    procs_at: int
    slot_size: int
    used_at: int  # in the slot
    mem_stride: int  # {context, module, buffer, offset, total[, 3 pad]} x u64
    util_at: int  # in the slot
    util_stride: int  # {dec, enc, sm[, 3 pad]} x u64
    status_at: int  # in the slot
    procnum_at: int
    last_kernel_at: int | None  # i64 unix seconds, v1 only


HAMI_V1 = _HamiLayout(
    name="hami-core-v1", size=2_008_952, num_at=56, uuids_at=64, limit_at=1600, procs_at=1856,
    slot_size=1960, used_at=8, mem_stride=64, util_at=1160, util_stride=48, status_at=1928,
    procnum_at=2_008_896, last_kernel_at=2_008_912,
)  # fmt: skip
HAMI_V0 = _HamiLayout(
    name="hami-core-v0", size=1_197_896, num_at=48, uuids_at=56, limit_at=1592, procs_at=1848,
    slot_size=1168, used_at=8, mem_stride=40, util_at=776, util_stride=24, status_at=1160,
    procnum_at=1_197_880, last_kernel_at=None,
)  # fmt: skip

# -- errors ---------------------------------------------------------------------------------------
TRUNCATED = "truncated"  # shorter than its layout (or a short read)
BAD_MAGIC = "bad_magic"  # neither libvgpu's nor HAMi-core's magic
UNINITIALIZED = "uninitialized"  # magic still 0: the creating process has not finished (transient)
UNKNOWN_VERSION = "unknown_version"  # right magic, unknown major version / size combination
BAD_HEADER = "bad_header"  # libvgpu header sizes disagree with the layout
SIZE_CHANGED = "size_changed"  # the file changed size while it was read
IO_ERROR = "io_error"  # open/read failed (permissions, vanished file)
MULTIPLE_FILES = "multiple_files"  # more than one *.cache file in one directory; the newest is read
OUT_OF_RANGE = "out_of_range"  # a device's figures exceed its card's memory (or 0-100 %): not exported
REASONS = (
    TRUNCATED, BAD_MAGIC, UNINITIALIZED, UNKNOWN_VERSION, BAD_HEADER, SIZE_CHANGED, IO_ERROR, MULTIPLE_FILES,
    OUT_OF_RANGE,
)  # fmt: skip


class RegionError(Exception):
    """A file that cannot be read as any known layout; `reason` is one of `REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Liveness(Protocol):
    """Answers whether the process behind a slot still runs (see `device_plugin.monitor.procs`)."""

    def libvgpu_alive(self, pid: int, start_time: int) -> bool:
        """`pid` in the container's namespace, `start_time` from /proc/<pid>/stat (0 = unknown)."""
        ...

    def hami_alive(self, pid: int, hostpid: int) -> bool:
        """HAMi-core slot: container `pid`, `hostpid` (0 when nobody filled it in)."""
        ...


@dataclass(frozen=True)
class DeviceReading:
    """One device of one container, summed over the container's live processes.

    Bytes throughout. `limit_bytes` is None when the container has no memory limit on the device.
    `busy_ns_total` (libvgpu only, None otherwise) is the container's measured GPU busy time, which
    libvgpu measures only on devices with a compute limit (`sm_limit` 1..99); `sm_util_percent`
    (HAMi-core only) is the sum of the slots' ``smUtil``. `last_kernel_time` is unix seconds, 0 = none.
    """

    index: int
    uuid: str
    limit_bytes: int | None
    used_bytes: int
    context_bytes: int
    module_bytes: int
    buffer_bytes: int
    sm_limit: int
    busy_ns_total: int | None
    sm_util_percent: float | None
    last_kernel_time: int


@dataclass(frozen=True)
class RegionReading:
    """What one file says: its `layout` name, the devices and the number of live processes."""

    layout: str
    devices: tuple[DeviceReading, ...]
    live_processes: int


def _pread(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise RegionError(TRUNCATED, f"short read: {len(data)} of {size} bytes at offset {offset}")
    return data


def read_region_fd(fd: int, alive: Liveness) -> RegionReading:
    """Read the region behind the open file `fd` (any of the three layouts).

    Raises `RegionError` (see `REASONS`); an `OSError` from the reads becomes reason ``io_error``.
    """
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise RegionError(TRUNCATED, f"{size} bytes, too short for any layout")
        magic, major = struct.unpack("<II", _pread(fd, 8, 0))
        if magic == VGPU_MAGIC:
            reading = _read_libvgpu(fd, size, major, alive)
        elif magic == HAMI_MAGIC:
            reading = _read_hami(fd, size, major, alive)
        elif magic == 0:
            raise RegionError(UNINITIALIZED, "magic is 0: the file is still being created")
        else:
            raise RegionError(BAD_MAGIC, f"magic {magic:#x} is neither libvgpu's nor HAMi-core's")
        after = os.fstat(fd).st_size
    except OSError as e:
        raise RegionError(IO_ERROR, f"read failed: {e.strerror or e}") from None
    if after != size:
        raise RegionError(SIZE_CHANGED, f"size changed from {size} to {after} bytes while reading")
    return reading


def read_region(path: str | os.PathLike[str], alive: Liveness) -> RegionReading:
    """`read_region_fd` on the file at `path` (opened read-only, closed again)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise RegionError(IO_ERROR, f"cannot open: {e.strerror or e}") from None
    try:
        return read_region_fd(fd, alive)
    finally:
        os.close(fd)


def _read_libvgpu(fd: int, size: int, major: int, alive: Liveness) -> RegionReading:
    if major != VGPU_MAJOR:
        raise RegionError(
            UNKNOWN_VERSION, f"libvgpu region major version {major}; this monitor reads {VGPU_MAJOR}"
        )
    if size < VGPU_REGION_SIZE:
        raise RegionError(TRUNCATED, f"libvgpu region of {size} bytes; layout 2.x is {VGPU_REGION_SIZE}")
    head = _VGPU_HEADER.unpack(_pread(fd, _VGPU_HEADER.size, 0))
    sizes = head[3:8]
    want = (VGPU_HEADER_SIZE, VGPU_DEVICE_SIZE, VGPU_SLOT_SIZE, VGPU_MAX_DEVICES, VGPU_MAX_SLOTS)
    if sizes != want:
        raise RegionError(BAD_HEADER, f"libvgpu header sizes {sizes}, want {want}")
    count = min(head[8], VGPU_MAX_DEVICES)
    hwm = min(head[9], VGPU_MAX_SLOTS)
    raw_dev = _pread(fd, count * VGPU_DEVICE_SIZE, VGPU_DEVICES_AT) if count else b""
    raw_slots = _pread(fd, hwm * VGPU_SLOT_SIZE, VGPU_SLOTS_AT) if hwm and count else b""

    used = [0] * count
    data = [0] * count
    context = [0] * count
    module = [0] * count
    live = 0
    for s in range(len(raw_slots) // VGPU_SLOT_SIZE):
        f = _VGPU_SLOT.unpack_from(raw_slots, s * VGPU_SLOT_SIZE)
        pid, start_time = f[0], f[2]
        if pid <= 0 or not alive.libvgpu_alive(pid, start_time):
            continue
        live += 1
        for d in range(count):
            used[d] += f[3 + d]
            data[d] += f[19 + d]
            context[d] += f[35 + d]
            module[d] += f[51 + d]

    devices = []
    for d in range(count):
        uuid_raw, limit, sm, phys, state, _pad, _pause, _cov, busy, last_kernel = _VGPU_DEVICE.unpack_from(
            raw_dev, d * VGPU_DEVICE_SIZE
        )
        if state != VGPU_DEVICE_READY:
            continue  # an entry being registered; its fields are not final yet
        uuid = _text(uuid_raw)
        if not uuid:
            continue
        devices.append(
            DeviceReading(
                index=phys,
                uuid=uuid,
                limit_bytes=None if limit == VGPU_UNLIMITED else limit,
                used_bytes=used[d],
                context_bytes=context[d],
                module_bytes=module[d],
                buffer_bytes=data[d],
                sm_limit=sm,
                busy_ns_total=busy if 0 < sm < 100 else None,
                sm_util_percent=None,
                last_kernel_time=last_kernel,
            )
        )
    return RegionReading(layout=f"libvgpu-{major}", devices=tuple(devices), live_processes=live)


def _read_hami(fd: int, size: int, major: int, alive: Liveness) -> RegionReading:
    if size >= HAMI_V1.size and major == 1:
        lay = HAMI_V1
    elif HAMI_V0.size <= size < HAMI_V1.size:
        lay = HAMI_V0
    elif size < HAMI_V0.size:
        raise RegionError(
            TRUNCATED, f"HAMi-core region of {size} bytes; v0 is {HAMI_V0.size}, v1 {HAMI_V1.size}"
        )
    else:
        raise RegionError(UNKNOWN_VERSION, f"HAMi-core region of {size} bytes with major version {major}")
    head = _pread(fd, lay.procs_at, 0)
    (num,) = struct.unpack_from("<Q", head, lay.num_at)
    count = min(num, HAMI_MAX_DEVICES)
    limits = struct.unpack_from(f"<{HAMI_MAX_DEVICES}Q", head, lay.limit_at)
    (procnum,) = struct.unpack("<i", _pread(fd, 4, lay.procnum_at))
    procnum = max(0, min(procnum, HAMI_MAX_PROCS))
    last_kernel = 0
    if lay.last_kernel_at is not None:
        (last_kernel,) = struct.unpack("<q", _pread(fd, 8, lay.last_kernel_at))
    raw_slots = _pread(fd, procnum * lay.slot_size, lay.procs_at) if procnum and count else b""

    mem = [[0, 0, 0, 0] for _ in range(count)]  # total, context, module, buffer
    util = [0] * count
    live = 0
    for s in range(len(raw_slots) // lay.slot_size):
        at = s * lay.slot_size
        pid, hostpid = struct.unpack_from("<ii", raw_slots, at)
        (status,) = struct.unpack_from("<i", raw_slots, at + lay.status_at)
        if status == 0 or pid <= 0 or not alive.hami_alive(pid, hostpid):
            continue
        live += 1
        for d in range(count):
            ctx, mod, buf, _off, total = struct.unpack_from(
                "<5Q", raw_slots, at + lay.used_at + d * lay.mem_stride
            )
            m = mem[d]
            m[0] += total
            m[1] += ctx
            m[2] += mod
            m[3] += buf
            (sm,) = struct.unpack_from("<Q", raw_slots, at + lay.util_at + d * lay.util_stride + 16)
            util[d] += sm

    devices = []
    for d in range(count):
        at = lay.uuids_at + d * HAMI_UUID_SIZE
        if head[at] == 0:
            continue  # not initialised yet
        uuid = _text(head[at : at + HAMI_UUID_LABEL])
        devices.append(
            DeviceReading(
                index=d,
                uuid=uuid,
                limit_bytes=limits[d],
                used_bytes=mem[d][0],
                context_bytes=mem[d][1],
                module_bytes=mem[d][2],
                buffer_bytes=mem[d][3],
                sm_limit=0,
                busy_ns_total=None,
                sm_util_percent=float(util[d]),
                last_kernel_time=max(0, last_kernel),
            )
        )
    return RegionReading(layout=lay.name, devices=tuple(devices), live_processes=live)


def _text(raw: bytes) -> str:
    """A NUL-terminated C string as a label value (undecodable bytes replaced, never an exception)."""
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace").strip()

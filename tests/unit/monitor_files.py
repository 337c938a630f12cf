"""Writers of region files for the monitor's tests and benchmark, byte for byte from the documented layouts.

Written from the layout descriptions, not from any library code: libvgpu 2.x from docs/libvgpu.md
("Shared region"), HAMi-core's ``shared_region_t`` v1 from the offsets the HAMi reference lists
(magic, sizes, every field offset), v0 from its rules (no version fields, 32-bit ``ownerPid``, inner
structs without pads, no ``lastKernelTime``) laid out with the C/Go alignment rules - the v0 total
then comes out at the reference's 1,197,896 bytes, which `test_monitor_regions` asserts.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

UNLIMITED = (1 << 64) - 1

# ---- libvgpu 2.x -------------------------------------------------------------------------------------
LIBVGPU_SIZE = 4096 + 16 * 256 + 1024 * 576  # 598,016


@dataclass
class VDev:
    uuid: str
    limit: int = UNLIMITED
    sm_limit: int = 100
    phys_index: int = 0
    state: int = 2
    busy_ns: int = 0
    last_kernel: int = 0


@dataclass
class VSlot:
    pid: int
    start_time: int = 0
    used: Sequence[int] = ()
    data: Sequence[int] = ()
    context: Sequence[int] = ()
    module: Sequence[int] = ()


def libvgpu_bytes(
    devices: Sequence[VDev],
    slots: Sequence[VSlot],
    *,
    magic: int = 0x55504756,
    major: int = 2,
    minor: int = 1,
    sizes: tuple[int, int, int, int, int] = (4096, 256, 576, 16, 1024),
    slot_hwm: int | None = None,
    device_count: int | None = None,
) -> bytes:
    buf = bytearray(LIBVGPU_SIZE)
    count = len(devices) if device_count is None else device_count
    hwm = len(slots) if slot_hwm is None else slot_hwm
    struct.pack_into("<8I2Iii", buf, 0, magic, major, minor, *sizes, count, hwm, 1, 0)
    for d, dev in enumerate(devices):
        at = 4096 + 256 * d
        buf[at : at + 96] = dev.uuid.encode().ljust(96, b"\0")
        struct.pack_into("<QIII", buf, at + 96, dev.limit, dev.sm_limit, dev.phys_index, dev.state)
        struct.pack_into("<QQ", buf, at + 136, dev.busy_ns, dev.last_kernel)
    for s, slot in enumerate(slots):
        at = 8192 + 576 * s
        struct.pack_into("<iiQ", buf, at, slot.pid, 0, slot.start_time)
        for base, values in ((16, slot.used), (144, slot.data), (272, slot.context), (400, slot.module)):
            for d, v in enumerate(values):
                struct.pack_into("<Q", buf, at + base + 8 * d, v)
    return bytes(buf)


# ---- HAMi-core shared_region_t -----------------------------------------------------------------------


@dataclass
class HProc:
    pid: int
    hostpid: int = 0
    status: int = 1
    # per device: (context, module, buffer, offset, total)
    used: Sequence[tuple[int, int, int, int, int]] = ()
    sm_util: Sequence[int] = ()


@dataclass
class HamiLayout:
    size: int
    magic_at: int
    version_at: int | None
    num_at: int
    uuids_at: int
    limit_at: int
    sm_limit_at: int
    procs_at: int
    slot_size: int
    used_at: int
    mem_stride: int
    monitorused_at: int
    util_at: int
    util_stride: int
    status_at: int
    procnum_at: int
    util_switch_at: int
    recent_kernel_at: int
    priority_at: int
    last_kernel_at: int | None
    extra: dict = field(default_factory=dict)


# v1, the offsets as the reference lists them (slot 1960 B: pid@0 hostpid@4 used[16]x64@8
# monitorused@1032 deviceUtil[16]x48@1160 status@1928).
V1 = HamiLayout(
    size=2_008_952, magic_at=0, version_at=4, num_at=56, uuids_at=64, limit_at=1600, sm_limit_at=1728,
    procs_at=1856, slot_size=1960, used_at=8, mem_stride=64, monitorused_at=1032, util_at=1160,
    util_stride=48, status_at=1928, procnum_at=2_008_896, util_switch_at=2_008_900,
    recent_kernel_at=2_008_904, priority_at=2_008_908, last_kernel_at=2_008_912,
)  # fmt: skip


def _v0() -> HamiLayout:
    """v0 from its rules: i32 initializedFlag, i32 smInitFlag, u32 ownerPid, sem_t (32 B), then the
    u64 device count at the next 8-byte boundary; inner structs of 5 and 3 u64 without pads; the slot
    padded to 8 after its i32 status; no lastKernelTime and no trailing pads."""

    def align(n: int, a: int) -> int:
        return (n + a - 1) // a * a

    sem_at = 12
    num_at = align(sem_at + 32, 8)  # 48
    uuids_at = num_at + 8  # 56
    limit_at = uuids_at + 16 * 96  # 1592
    sm_limit_at = limit_at + 16 * 8  # 1720
    procs_at = sm_limit_at + 16 * 8  # 1848
    used_at, mem_stride = 8, 40
    monitorused_at = used_at + 16 * mem_stride  # 648
    util_at, util_stride = monitorused_at + 16 * 8, 24  # 776
    status_at = util_at + 16 * util_stride  # 1160
    slot_size = align(status_at + 4, 8)  # 1168
    procnum_at = procs_at + 1024 * slot_size  # 1197880
    return HamiLayout(
        size=procnum_at + 16, magic_at=0, version_at=None, num_at=num_at, uuids_at=uuids_at,
        limit_at=limit_at, sm_limit_at=sm_limit_at, procs_at=procs_at, slot_size=slot_size,
        used_at=used_at, mem_stride=mem_stride, monitorused_at=monitorused_at, util_at=util_at,
        util_stride=util_stride, status_at=status_at, procnum_at=procnum_at,
        util_switch_at=procnum_at + 4, recent_kernel_at=procnum_at + 8, priority_at=procnum_at + 12,
        last_kernel_at=None,
    )  # fmt: skip


V0 = _v0()


def hami_bytes(
    layout: HamiLayout,
    uuids: Sequence[str],
    limits: Sequence[int],
    procs: Sequence[HProc],
    *,
    procnum: int | None = None,
    last_kernel_time: int = 0,
    major: int = 1,
    minor: int = 2,
    magic: int = 19920718,
    num: int | None = None,
) -> bytes:
    buf = bytearray(layout.size)
    struct.pack_into("<i", buf, layout.magic_at, magic)
    if layout.version_at is not None:
        struct.pack_into("<ii", buf, layout.version_at, major, minor)
    struct.pack_into("<Q", buf, layout.num_at, len(uuids) if num is None else num)
    for d, u in enumerate(uuids):
        at = layout.uuids_at + 96 * d
        buf[at : at + 96] = u.encode().ljust(96, b"\0")
    for d, lim in enumerate(limits):
        struct.pack_into("<Q", buf, layout.limit_at + 8 * d, lim)
    for s, p in enumerate(procs):
        at = layout.procs_at + layout.slot_size * s
        struct.pack_into("<ii", buf, at, p.pid, p.hostpid)
        for d, mem in enumerate(p.used):
            struct.pack_into("<5Q", buf, at + layout.used_at + layout.mem_stride * d, *mem)
        for d, sm in enumerate(p.sm_util):
            # {decUtil, encUtil, smUtil}: smUtil is the third u64
            struct.pack_into("<3Q", buf, at + layout.util_at + layout.util_stride * d, 7, 9, sm)
        struct.pack_into("<i", buf, at + layout.status_at, p.status)
    struct.pack_into("<iiii", buf, layout.procnum_at, len(procs) if procnum is None else procnum, 1, 2, 1)
    if layout.last_kernel_at is not None:
        struct.pack_into("<q", buf, layout.last_kernel_at, last_kernel_time)
    return bytes(buf)


def self_start_time() -> int:
    """This process's /proc/self/stat starttime (field 22), as libvgpu stores it in its slot."""
    raw = Path("/proc/self/stat").read_bytes()
    return int(raw[raw.rfind(b")") + 2 :].split()[19])


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path

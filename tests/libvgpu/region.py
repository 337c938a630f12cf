"""A reader of the libvgpu shared region (layout 2.2, libvgpu/include/vgpu_region.h), as the
node monitor would implement it: fixed little-endian offsets, checked magic and version."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

HEADER = struct.Struct("<8I2Iii")  # magic..max_slots, device_count, slot_hwm, priority, blocked
DEVICE_SIZE, SLOT_SIZE, MAX_DEVICES, MAX_SLOTS = 256, 576, 16, 1024
DEVICES_AT, SLOTS_AT = 4096, 4096 + 16 * 256


@dataclass(frozen=True)
class Device:
    uuid: str
    limit_bytes: int
    sm_limit: int
    phys_index: int
    busy_ns_total: int
    throttled_ns_total: int


@dataclass(frozen=True)
class Slot:
    pid: int
    used: tuple[int, ...]
    data: tuple[int, ...]
    context: tuple[int, ...]
    module: tuple[int, ...]


@dataclass(frozen=True)
class Region:
    magic: int
    major: int
    minor: int
    device_count: int
    priority: int
    devices: list[Device]
    slots: list[Slot]


def read_region(path: Path) -> Region:
    """Parses the region file at `path`; raises ValueError on a foreign magic or major version."""
    raw = Path(path).read_bytes()
    f = HEADER.unpack_from(raw, 0)
    magic, major, minor = f[0], f[1], f[2]
    if magic != 0x55504756 or major != 2:
        raise ValueError(f"not a libvgpu 2.x region: magic {magic:#x} major {major}")
    count, hwm, priority = f[8], f[9], f[10]
    devices = []
    for i in range(min(count, MAX_DEVICES)):
        at = DEVICES_AT + i * DEVICE_SIZE
        uuid = raw[at : at + 96].split(b"\0", 1)[0].decode()
        limit, sm, phys = struct.unpack_from("<QII", raw, at + 96)
        busy, _last_kernel, throttled = struct.unpack_from("<3Q", raw, at + 136)
        devices.append(Device(uuid, limit, sm, phys, busy, throttled))
    slots = []
    for i in range(min(hwm, MAX_SLOTS)):
        at = SLOTS_AT + i * SLOT_SIZE
        (pid,) = struct.unpack_from("<i", raw, at)
        used = struct.unpack_from("<16Q", raw, at + 16)
        data = struct.unpack_from("<16Q", raw, at + 144)
        context = struct.unpack_from("<16Q", raw, at + 272)
        module = struct.unpack_from("<16Q", raw, at + 400)
        slots.append(Slot(pid, used, data, context, module))
    return Region(magic, major, minor, count, priority, devices, slots)

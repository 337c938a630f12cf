"""The monitor's region readers on files written byte for byte from the documented layouts, and fuzzed:
no exception but `RegionError` ever escapes, and every bad file names a reason."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_plugin.monitor import regions
from device_plugin.monitor.regions import RegionError, read_region
from tests.unit.monitor_files import (
    LIBVGPU_SIZE,
    UNLIMITED,
    V0,
    V1,
    HProc,
    VDev,
    VSlot,
    hami_bytes,
    libvgpu_bytes,
)

MIB = 1 << 20
UUID0 = "GPU-8b0e5a9c-1111-2222-3333-444455556666"
UUID1 = "GPU-8b0e5a9c-aaaa-bbbb-cccc-ddddeeeeffff"


class Alive:
    """Liveness by a fixed set of pids (and, for libvgpu, start times)."""

    def __init__(self, pids: dict[int, int] | set[int], hostpids: set[int] = frozenset()) -> None:
        self.pids = pids if isinstance(pids, dict) else {p: 0 for p in pids}
        self.hostpids = hostpids
        self.calls = 0

    def libvgpu_alive(self, pid: int, start_time: int) -> bool:
        self.calls += 1
        return pid in self.pids and (start_time == 0 or self.pids[pid] == start_time)

    def hami_alive(self, pid: int, hostpid: int) -> bool:
        self.calls += 1
        return hostpid in self.hostpids if hostpid else pid in self.pids


def put(tmp: Path, data: bytes, name: str = "r.cache") -> Path:
    p = tmp / name
    p.write_bytes(data)
    return p


def test_layout_sizes_match_the_references():
    assert LIBVGPU_SIZE == regions.VGPU_REGION_SIZE == 598_016
    assert V1.size == regions.HAMI_V1.size == 2_008_952
    assert V0.size == regions.HAMI_V0.size == 1_197_896  # derived from v0's rules in monitor_files
    for ours, theirs in ((regions.HAMI_V1, V1), (regions.HAMI_V0, V0)):
        assert (ours.num_at, ours.uuids_at, ours.limit_at, ours.procs_at, ours.slot_size) == (
            theirs.num_at, theirs.uuids_at, theirs.limit_at, theirs.procs_at, theirs.slot_size,
        )  # fmt: skip
        assert (ours.used_at, ours.mem_stride, ours.util_at, ours.util_stride, ours.status_at, ours.procnum_at) == (
            theirs.used_at, theirs.mem_stride, theirs.util_at, theirs.util_stride, theirs.status_at,
            theirs.procnum_at,
        )  # fmt: skip


def test_libvgpu_sums_live_slots_per_device(tmp_path):
    data = libvgpu_bytes(
        [
            VDev(
                UUID0,
                limit=4000 * MIB,
                sm_limit=30,
                phys_index=1,
                busy_ns=5_000_000,
                last_kernel=1_700_000_000,
            ),
            VDev(UUID1, limit=UNLIMITED, sm_limit=100, phys_index=0, busy_ns=123),
        ],
        [
            VSlot(
                100,
                11,
                used=[300 * MIB, 5 * MIB],
                data=[200 * MIB, 5 * MIB],
                context=[90 * MIB],
                module=[10 * MIB],
            ),
            VSlot(0, 0, used=[999 * MIB]),  # free slot
            VSlot(101, 12, used=[100 * MIB], data=[100 * MIB]),
            VSlot(102, 13, used=[7 * MIB]),  # dead process: not counted
            VSlot(103, 99, used=[8 * MIB]),  # pid reused by another process (start time differs)
        ],
    )
    r = read_region(put(tmp_path, data), Alive({100: 11, 101: 12, 103: 14}))
    assert r.layout == "libvgpu-2"
    assert r.live_processes == 2
    d0, d1 = r.devices
    assert (d0.uuid, d0.index, d0.limit_bytes, d0.sm_limit) == (UUID0, 1, 4000 * MIB, 30)
    assert (d0.used_bytes, d0.buffer_bytes, d0.context_bytes, d0.module_bytes) == (
        400 * MIB, 300 * MIB, 90 * MIB, 10 * MIB,
    )  # fmt: skip
    assert d0.busy_ns_total == 5_000_000 and d0.last_kernel_time == 1_700_000_000
    assert d0.sm_util_percent is None
    assert (d1.uuid, d1.index, d1.limit_bytes, d1.used_bytes) == (UUID1, 0, None, 5 * MIB)
    assert d1.busy_ns_total is None  # no compute limit: libvgpu does not measure busy time


def test_libvgpu_entry_being_registered_is_skipped(tmp_path):
    data = libvgpu_bytes([VDev(UUID0, limit=MIB), VDev(UUID1, limit=MIB, state=1)], [VSlot(5, used=[1, 2])])
    r = read_region(put(tmp_path, data), Alive({5}))
    assert [d.uuid for d in r.devices] == [UUID0]


def test_libvgpu_counts_are_clamped_to_the_layout(tmp_path):
    data = libvgpu_bytes([VDev(UUID0, limit=MIB)], [VSlot(5, used=[3])], slot_hwm=5000, device_count=1)
    r = read_region(put(tmp_path, data), Alive({5}))
    assert r.devices[0].used_bytes == 3


def _hami_procs() -> list[HProc]:
    return [
        HProc(
            200,
            used=[(10 * MIB, 2 * MIB, 500 * MIB, 0, 512 * MIB), (0, 0, 64 * MIB, 0, 64 * MIB)],
            sm_util=[30, 5],
        ),
        HProc(201, status=0, used=[(0, 0, 0, 0, 900 * MIB)], sm_util=[90]),  # inactive slot
        HProc(202, used=[(0, 0, 100 * MIB, 0, 100 * MIB)], sm_util=[20]),
        HProc(203, hostpid=40203, used=[(0, 0, 1 * MIB, 0, 1 * MIB)], sm_util=[1]),  # hostpid alive
        HProc(204, hostpid=40204, used=[(0, 0, 3 * MIB, 0, 3 * MIB)], sm_util=[1]),  # hostpid dead
        HProc(299, used=[(0, 0, 0, 0, 700 * MIB)], sm_util=[50]),  # dead pid
    ]


@pytest.mark.parametrize("layout", [V1, V0], ids=["v1", "v0"])
def test_hami_core_region(tmp_path, layout):
    data = hami_bytes(
        layout,
        [UUID0, UUID1],
        [8000 * MIB, 2000 * MIB],
        _hami_procs(),
        last_kernel_time=1_700_000_123,
    )
    r = read_region(put(tmp_path, data), Alive({200, 202, 203, 204}, hostpids={40203}))
    assert r.layout == ("hami-core-v1" if layout is V1 else "hami-core-v0")
    assert r.live_processes == 3
    d0, d1 = r.devices
    assert (d0.index, d0.uuid, d0.limit_bytes) == (0, UUID0, 8000 * MIB)
    assert d0.used_bytes == 613 * MIB
    assert (d0.context_bytes, d0.module_bytes, d0.buffer_bytes) == (10 * MIB, 2 * MIB, 601 * MIB)
    assert d0.sm_util_percent == 51.0
    assert (d1.index, d1.uuid, d1.limit_bytes, d1.used_bytes, d1.sm_util_percent) == (
        1, UUID1, 2000 * MIB, 64 * MIB, 5.0,
    )  # fmt: skip
    assert d0.last_kernel_time == (1_700_000_123 if layout is V1 else 0)
    assert d0.busy_ns_total is None


def test_hami_uuid_label_is_the_first_40_bytes_and_empty_slots_are_skipped(tmp_path):
    long = UUID0 + "-EXTRA"
    data = hami_bytes(V1, [long, "", UUID1], [MIB, MIB, MIB], [HProc(1, used=[(0, 0, 0, 0, 5)] * 3)])
    r = read_region(put(tmp_path, data), Alive({1}))
    assert [(d.index, d.uuid) for d in r.devices] == [(0, UUID0), (2, UUID1)]


def test_hami_procnum_is_clamped(tmp_path):
    data = hami_bytes(V0, [UUID0], [MIB], [HProc(1, used=[(0, 0, 0, 0, 5)])], procnum=-3)
    assert read_region(put(tmp_path, data), Alive({1})).devices[0].used_bytes == 0
    data = hami_bytes(V0, [UUID0], [MIB], [HProc(1, used=[(0, 0, 0, 0, 5)])], procnum=99999)
    assert read_region(put(tmp_path, data), Alive({1})).devices[0].used_bytes == 5


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", regions.TRUNCATED),
        (b"VGPU", regions.TRUNCATED),
        (libvgpu_bytes([VDev(UUID0)], [])[:5000], regions.TRUNCATED),
        (libvgpu_bytes([VDev(UUID0)], [], major=3), regions.UNKNOWN_VERSION),
        (libvgpu_bytes([VDev(UUID0)], [], sizes=(4096, 256, 512, 16, 1024)), regions.BAD_HEADER),
        (libvgpu_bytes([VDev(UUID0)], [], magic=0), regions.UNINITIALIZED),
        (libvgpu_bytes([VDev(UUID0)], [], magic=0xDEADBEEF), regions.BAD_MAGIC),
        (hami_bytes(V0, [UUID0], [MIB], [])[: V0.size - 1], regions.TRUNCATED),
        (hami_bytes(V1, [UUID0], [MIB], [], major=2), regions.UNKNOWN_VERSION),
        (hami_bytes(V1, [UUID0], [MIB], [])[: V1.size - 8], None),
    ],
    ids=[
        "empty",
        "magic-only",
        "libvgpu-short",
        "libvgpu-major3",
        "libvgpu-slot-size",
        "zero-magic",
        "wrong-magic",
        "v0-short",
        "v1-major2",
        "v1-cut-is-v0",
    ],  # fmt: skip
)
def test_bad_files_raise_a_reason(tmp_path, data, reason):
    path = put(tmp_path, data)
    if reason is None:
        # A v1 file cut below the v1 size falls into the v0 size range: read as v0 (HAMi's rule),
        # which must not fail even though its bytes are v1's.
        assert read_region(path, Alive(set())).layout == "hami-core-v0"
        return
    with pytest.raises(RegionError) as e:
        read_region(path, Alive(set()))
    assert e.value.reason == reason


def test_missing_file_is_an_io_error(tmp_path):
    with pytest.raises(RegionError) as e:
        read_region(tmp_path / "nope.cache", Alive(set()))
    assert e.value.reason == regions.IO_ERROR


class Grower(Alive):
    """Appends to the file while the reader is between its first and last read."""

    def __init__(self, path: Path, **kw) -> None:
        super().__init__({1, 200}, **kw)
        self.path = path

    def _grow(self) -> None:
        with open(self.path, "ab") as f:
            f.write(b"\0" * 4096)

    def libvgpu_alive(self, pid: int, start_time: int) -> bool:
        self._grow()
        return True

    def hami_alive(self, pid: int, hostpid: int) -> bool:
        self._grow()
        return True


@pytest.mark.parametrize("kind", ["libvgpu", "v1", "v0"])
def test_a_file_growing_while_read_is_refused(tmp_path, kind):
    if kind == "libvgpu":
        data = libvgpu_bytes([VDev(UUID0, limit=MIB)], [VSlot(1, used=[5])])
    else:
        data = hami_bytes(V1 if kind == "v1" else V0, [UUID0], [MIB], [HProc(200, used=[(0, 0, 0, 0, 5)])])
    path = put(tmp_path, data)
    with pytest.raises(RegionError) as e:
        read_region(path, Grower(path))
    assert e.value.reason == regions.SIZE_CHANGED


def test_reader_never_writes_the_file(tmp_path):
    data = hami_bytes(V1, [UUID0], [MIB], _hami_procs())
    path = put(tmp_path, data)
    os.chmod(path, 0o444)
    before = path.stat().st_mtime_ns
    read_region(path, Alive({200}))
    assert path.read_bytes() == data and path.stat().st_mtime_ns == before


# ---- fuzz ----------------------------------------------------------------------------------------------

_VALID = [
    libvgpu_bytes([VDev(UUID0, limit=MIB, sm_limit=50, busy_ns=9)], [VSlot(1, used=[5], data=[5])]),
    hami_bytes(V1, [UUID0], [MIB], [HProc(1, used=[(1, 1, 1, 0, 3)], sm_util=[4])]),
    hami_bytes(V0, [UUID0], [MIB], [HProc(1, used=[(1, 1, 1, 0, 3)], sm_util=[4])]),
]
_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _read_or_reason(path: Path) -> str | None:
    try:
        r = read_region(path, Alive({1}))
    except RegionError as e:
        assert e.reason in regions.REASONS
        return e.reason
    for d in r.devices:  # whatever was read is well-formed
        assert d.used_bytes >= 0 and isinstance(d.uuid, str)
    return None


@_FUZZ
@given(data=st.binary(max_size=9000))
def test_fuzz_random_bytes(tmp_path, data):
    _read_or_reason(put(tmp_path, data))


@_FUZZ
@given(which=st.integers(0, 2), cut=st.integers(0, 2_008_952))
def test_fuzz_truncated_valid_files(tmp_path, which, cut):
    data = _VALID[which]
    cut = min(cut, len(data))
    reason = _read_or_reason(put(tmp_path, data[:cut]))
    if cut < len(data) and not (which == 1 and cut >= V0.size):
        assert reason == regions.TRUNCATED


@_FUZZ
@given(
    which=st.integers(0, 2),
    edits=st.lists(st.tuples(st.integers(0, 9000), st.binary(min_size=1, max_size=16)), max_size=8),
)
def test_fuzz_corrupted_headers_and_tables(tmp_path, which, edits):
    buf = bytearray(_VALID[which])
    for at, chunk in edits:
        buf[at : at + len(chunk)] = chunk
    _read_or_reason(put(tmp_path, bytes(buf)))


@_FUZZ
@given(
    magic=st.integers(1, 2**32 - 1).filter(lambda m: m not in (0x55504756, 19920718)), which=st.integers(0, 2)
)
def test_fuzz_wrong_magic(tmp_path, magic, which):
    buf = bytearray(_VALID[which])
    struct.pack_into("<I", buf, 0, magic)
    assert _read_or_reason(put(tmp_path, bytes(buf))) == regions.BAD_MAGIC


def test_a_fifo_or_a_link_swapped_in_after_the_listing_is_refused_without_blocking(tmp_path):
    # The container's directory is the tenant's: between the scan's listing (regular files only) and
    # the open, the tenant can rename a FIFO or a link over its region file. A FIFO opened for reading
    # waits for a writer that never comes (the scan thread, and every metric of the node, with it); a
    # link points the monitor at a file that is not the tenant's.
    import threading

    good = put(tmp_path, libvgpu_bytes([VDev(UUID0, limit=MIB)], [VSlot(1, used=[MIB])]))
    fifo = tmp_path / "fifo.cache"
    os.mkfifo(fifo)
    link = tmp_path / "link.cache"
    os.symlink(good, link)
    for path in (fifo, link):
        outcome: list[object] = []

        def read(path: Path = path, outcome: list[object] = outcome) -> None:
            try:
                outcome.append(read_region(path, Alive({1})))
            except RegionError as e:
                outcome.append(e)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(5)
        if t.is_alive():  # release the blocked open before failing
            with open(fifo, "wb"):
                pass
            t.join(5)
        assert outcome and isinstance(outcome[0], RegionError), (path.name, outcome)
        assert outcome[0].reason == regions.IO_ERROR

"""The scan: directories -> samples with pod names, utilisation from busy time, error counting once per
bad file, and the grace-period removal that never touches a directory whose pod exists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_plugin.monitor import regions
from device_plugin.monitor.pods import PodIndex
from device_plugin.monitor.scanner import Scanner, parse_dir_name
from tests.unit.monitor_files import (
    V0,
    V1,
    HProc,
    VDev,
    VSlot,
    hami_bytes,
    libvgpu_bytes,
    self_start_time,
    write,
)

MIB = 1 << 20
UUID0 = "GPU-00000000-1111-2222-3333-444455556666"
UID_A = "6f1c3a52-0000-4000-8000-00000000000a"
UID_B = "6f1c3a52-0000-4000-8000-00000000000b"


def pod(uid: str, name: str, ns: str = "team-a") -> dict:
    return {"metadata": {"uid": uid, "name": name, "namespace": ns}}


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t
        self.mono = 1000.0

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.mono

    def advance(self, s: float) -> None:
        self.t += s
        self.mono += s


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(tmp: Path, pods: PodIndex, clock: Clock, **kw) -> tuple[Scanner, list[str], list[str]]:
    errors: list[str] = []
    removed: list[str] = []
    s = Scanner(
        tmp,
        pods,
        on_error=errors.append,
        on_removed=removed.append,
        clock=clock.time,
        monotonic=clock.monotonic,
        **kw,
    )
    return s, errors, removed


def me_slot(**kw) -> VSlot:
    return VSlot(os.getpid(), self_start_time(), **kw)


def synced(*pods_: dict) -> PodIndex:
    idx = PodIndex()
    idx.on_sync(list(pods_))
    return idx


def test_dir_names():
    assert parse_dir_name(f"{UID_A}_main") == (UID_A, "main")
    assert parse_dir_name("nounderscore") is None
    assert parse_dir_name("_x") is None and parse_dir_name("x_") is None


def test_samples_carry_pod_names_and_exact_bytes(tmp_path, clock):
    write(
        tmp_path / f"{UID_A}_main" / "a.cache",
        libvgpu_bytes(
            [VDev(UUID0, limit=1000 * MIB, phys_index=0)], [me_slot(used=[300 * MIB], data=[300 * MIB])]
        ),
    )
    write(
        tmp_path / f"{UID_B}_side" / "b.cache",
        hami_bytes(
            V1, [UUID0], [2000 * MIB], [HProc(os.getpid(), used=[(0, 0, 0, 0, 64 * MIB)], sm_util=[12])]
        ),
    )
    (tmp_path / "6f1c3a52-ffff_nopod").mkdir()  # unknown pod: not exported
    (tmp_path / f"{UID_A}_nocache").mkdir()  # no region yet: not exported
    scanner, errors, _ = make(tmp_path, synced(pod(UID_A, "train-0"), pod(UID_B, "infer-1", "team-b")), clock)
    snap = scanner.scan()
    got = {(c.pod.namespace, c.pod.name, c.container, c.layout): c.devices for c in snap.containers}
    assert set(got) == {
        ("team-a", "train-0", "main", "libvgpu-2"),
        ("team-b", "infer-1", "side", "hami-core-v1"),
    }
    (a,) = got["team-a", "train-0", "main", "libvgpu-2"]
    assert (a.uuid, a.index, a.used_bytes, a.limit_bytes, a.buffer_bytes) == (
        UUID0,
        0,
        300 * MIB,
        1000 * MIB,
        300 * MIB,
    )
    assert a.utilization_percent is None  # no compute limit on this device
    (b,) = got["team-b", "infer-1", "side", "hami-core-v1"]
    assert (b.used_bytes, b.limit_bytes, b.utilization_percent) == (64 * MIB, 2000 * MIB, 12.0)
    assert snap.unmatched_dirs == 1
    assert errors == []


def test_utilisation_is_busy_time_growth_over_wall_time(tmp_path, clock):
    path = tmp_path / f"{UID_A}_main" / "a.cache"

    def put(busy_ns: int, last_kernel: int = 0) -> None:
        write(path, libvgpu_bytes([VDev(UUID0, limit=MIB, sm_limit=40, busy_ns=busy_ns, last_kernel=last_kernel)],
                                  [me_slot(used=[1])]))  # fmt: skip

    scanner, _, _ = make(tmp_path, synced(pod(UID_A, "p")), clock)
    put(1_000_000_000)
    (d,) = scanner.scan().containers[0].devices
    assert d.utilization_percent is None and d.last_kernel_elapsed_s is None  # first sample only
    clock.advance(5.0)
    put(3_000_000_000, last_kernel=int(clock.t) - 2)  # 2 s busy in 5 s of wall time
    (d,) = scanner.scan().containers[0].devices
    assert d.utilization_percent == pytest.approx(40.0)
    assert d.last_kernel_elapsed_s == pytest.approx(2.0, abs=1.0)
    clock.advance(5.0)
    put(3_000_000_000)  # idle
    assert scanner.scan().containers[0].devices[0].utilization_percent == 0.0
    clock.advance(1.0)
    put(100)  # the file was recreated: counter went back, no figure this scan
    assert scanner.scan().containers[0].devices[0].utilization_percent is None


def test_a_bad_file_is_counted_once_until_it_changes_state(tmp_path, clock):
    path = tmp_path / f"{UID_A}_main" / "a.cache"
    write(path, b"\x01\x02\x03\x04garbage-garbage")
    scanner, errors, _ = make(tmp_path, synced(pod(UID_A, "p")), clock)
    for _ in range(3):
        assert scanner.scan().containers == ()
    assert errors == [regions.BAD_MAGIC]
    write(path, libvgpu_bytes([VDev(UUID0, limit=MIB)], [me_slot(used=[7])]))
    assert scanner.scan().containers[0].devices[0].used_bytes == 7
    write(path, libvgpu_bytes([VDev(UUID0, limit=MIB)], [me_slot(used=[7])])[:100])
    scanner.scan()
    assert errors == [regions.BAD_MAGIC, regions.TRUNCATED]


def test_several_cache_files_read_the_newest(tmp_path, clock):
    d = tmp_path / f"{UID_A}_main"
    old = write(d / "old.cache", libvgpu_bytes([VDev(UUID0, limit=MIB)], [me_slot(used=[1])]))
    write(d / "new.cache", libvgpu_bytes([VDev(UUID0, limit=MIB)], [me_slot(used=[2])]))
    os.utime(old, (1, 1))
    scanner, errors, _ = make(tmp_path, synced(pod(UID_A, "p")), clock)
    assert scanner.scan().containers[0].devices[0].used_bytes == 2
    scanner.scan()
    assert errors == [regions.MULTIPLE_FILES]


def _age(path: Path, now: float, seconds: float) -> None:
    os.utime(path, (now - seconds, now - seconds))


def test_gone_pods_directories_are_removed_after_the_grace_period_only(tmp_path, clock):
    keep = tmp_path / f"{UID_A}_main"
    gone = tmp_path / f"{UID_B}_main"
    gone2 = tmp_path / f"{UID_B}_sidecar"
    for d in (keep, gone, gone2):
        write(d / "x.cache", libvgpu_bytes([VDev(UUID0, limit=MIB)], [me_slot(used=[1])]))
        _age(d, clock.t, 10_000)  # old directories: only the observed absence decides
    scanner, _, removed = make(tmp_path, synced(pod(UID_A, "still-here")), clock, grace_s=300)
    scanner.scan()
    clock.advance(299)
    scanner.scan()
    assert gone.exists() and gone2.exists()
    clock.advance(2)
    scanner.scan()
    assert not gone.exists() and not gone2.exists()
    assert sorted(removed) == sorted([str(gone), str(gone2)])
    assert keep.exists()


def test_recent_directories_and_unsynced_indexes_are_kept(tmp_path, clock):
    d = tmp_path / f"{UID_B}_main"
    write(d / "x.cache", b"")
    scanner, _, removed = make(tmp_path, synced(), clock, grace_s=300)
    scanner.scan()
    clock.advance(400)
    _age(d, clock.t, 10)  # touched 10 s ago: a container may be starting there
    scanner.scan()
    assert d.exists() and removed == []

    unsynced = PodIndex()
    scanner, _, removed = make(tmp_path, unsynced, clock, grace_s=300)
    _age(d, clock.t, 10_000)
    scanner.scan()
    clock.advance(1000)
    scanner.scan()
    assert d.exists() and removed == []


def test_removal_needs_the_api_servers_confirmation(tmp_path, clock):
    d = tmp_path / f"{UID_B}_main"
    write(d / "x.cache", b"")
    _age(d, clock.t, 10_000)
    asked: list[set[str]] = []

    def still_exists(uids: set[str]) -> set[str]:
        asked.append(set(uids))
        return set()  # the fresh list has the pod: nothing is gone

    scanner, _, removed = make(tmp_path, synced(), clock, grace_s=60, confirm_gone=still_exists)
    scanner.scan()
    clock.advance(61)
    scanner.scan()
    assert asked == [{UID_B}] and d.exists() and removed == []

    def unreachable(uids: set[str]) -> set[str]:
        raise ConnectionError("API server down")

    scanner, _, removed = make(tmp_path, synced(), clock, grace_s=60, confirm_gone=unreachable)
    scanner.scan()
    clock.advance(61)
    scanner.scan()
    assert d.exists() and removed == []


def test_a_pod_that_reappears_resets_the_grace_period(tmp_path, clock):
    d = tmp_path / f"{UID_A}_main"
    write(d / "x.cache", libvgpu_bytes([VDev(UUID0, limit=MIB)], [me_slot(used=[1])]))
    _age(d, clock.t, 10_000)
    idx = synced()
    scanner, _, removed = make(tmp_path, idx, clock, grace_s=100)
    scanner.scan()
    clock.advance(90)
    idx.on_add(pod(UID_A, "late"))  # the watch was behind
    assert scanner.scan().containers[0].pod.name == "late"
    idx.on_delete(pod(UID_A, "late"))
    scanner.scan()  # absent again from here: a new grace period starts
    clock.advance(99)
    scanner.scan()
    assert d.exists()
    clock.advance(2)
    scanner.scan()
    assert not d.exists() and removed == [str(d)]


def test_missing_containers_dir_is_not_an_error(tmp_path, clock):
    scanner, errors, _ = make(tmp_path / "absent", synced(), clock)
    assert scanner.scan().containers == () and errors == []


_FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(
    data=st.binary(max_size=4096),
    layout=st.sampled_from(["libvgpu", "v1", "v0", "none"]),
    cut=st.integers(0, 64),
)
def test_fuzz_scanner_never_raises_and_counts_every_bad_file(tmp_path, data, layout, cut):
    # A fresh directory per example so each bad file is a new entry for the counter.
    d = tmp_path / f"{os.urandom(8).hex()}_c"
    if layout == "libvgpu":
        blob = libvgpu_bytes([VDev(UUID0, limit=MIB)], [me_slot(used=[1])])
    elif layout == "none":
        blob = b""
    else:
        blob = hami_bytes(
            V1 if layout == "v1" else V0, [UUID0], [MIB], [HProc(os.getpid(), used=[(0, 0, 0, 0, 1)])]
        )
    blob = data + blob[len(data) + cut :] if layout != "none" else data
    write(d / "f.cache", blob)
    uid = d.name.split("_")[0]
    scanner, errors, _ = make(tmp_path, synced(pod(uid, "p")), Clock())
    snap = scanner.scan()
    mine = [c for c in snap.containers if c.pod.uid == uid]
    assert len(mine) + len(errors) == 1  # exported, or counted with a reason: never both, never neither
    assert all(e in regions.REASONS for e in errors)


def test_absence_is_counted_only_from_the_first_complete_pod_list(tmp_path, clock):
    d = tmp_path / f"{UID_B}_main"
    write(d / "x.cache", b"")
    _age(d, clock.t, 10_000)
    idx = PodIndex()
    scanner, _, removed = make(tmp_path, idx, clock, grace_s=100)
    scanner.scan()
    clock.advance(1000)  # a long time without a pod list (API server unreachable)
    scanner.scan()
    idx.on_sync([])
    scanner.scan()  # the clock starts here
    assert d.exists()
    clock.advance(99)
    scanner.scan()
    assert d.exists() and removed == []
    clock.advance(2)
    scanner.scan()
    assert not d.exists()

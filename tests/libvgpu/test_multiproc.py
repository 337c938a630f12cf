"""All processes of a container share one limit through the region file: racing processes
can never both pass, killed processes give their memory back within a second, forked
children get their own slot, and CUDA_VISIBLE_DEVICES subsets charge the right device.
"""

from __future__ import annotations

import os
import random
import signal
import time

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB, parse
from .region import read_region

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "64m"}


def wait_line(proc, want: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(want):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no {want!r} line from {proc.args}")


def test_racers_for_the_last_bytes_cannot_both_pass(cli):
    for round_ in range(4):
        go = cli.tmp / f"go{round_}"
        procs = [
            cli.popen("init", "waitfile", str(go), "alloc", "40m", "sleep", "300", env=LIMIT)
            for _ in range(8)
        ]
        for p in procs:  # every racer initialised and parked at the start line
            wait_line(p, "waiting")
        go.touch()
        results = [parse(p.returncode, *p.communicate(timeout=20)) for p in procs]
        codes = sorted(r.codes("alloc")[0] for r in results)
        assert codes == [CUDA_SUCCESS] + [CUDA_ERROR_OUT_OF_MEMORY] * 7


def test_many_processes_fill_the_limit_exactly(cli):
    go = cli.tmp / "go"
    procs = [
        cli.popen("init", "waitfile", str(go), "alloc", "4m", "sleep", "500", env=LIMIT) for _ in range(20)
    ]
    for p in procs:
        wait_line(p, "waiting")
    go.touch()
    results = [parse(p.returncode, *p.communicate(timeout=30)) for p in procs]
    codes = [r.codes("alloc")[0] for r in results]
    assert codes.count(CUDA_SUCCESS) == 16  # 16 x 4 MiB = 64 MiB
    assert codes.count(CUDA_ERROR_OUT_OF_MEMORY) == 4


def test_sequential_processes_see_each_others_usage(cli):
    holder = cli.popen("init", "alloc", "40m", "hold", env=LIMIT)
    wait_line(holder, "hold")
    r = cli.run("init", "meminfo", "alloc", "24m", "alloc", "1", env=LIMIT)
    assert r.op(1) == ["meminfo", "0", str(24 * MIB), str(64 * MIB)]
    assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    holder.kill()
    holder.wait()


def test_exit_without_free_releases_the_slot(cli):
    assert cli.run("init", "alloc", "60m", env=LIMIT).codes("alloc") == [CUDA_SUCCESS]
    r = cli.run("init", "meminfo", "alloc", "64m", env=LIMIT)
    assert r.op(1) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]
    assert r.codes("alloc") == [CUDA_SUCCESS]


def test_sigkilled_holder_is_released_by_the_allocation_that_needs_its_memory(cli):
    # The reservation retries at most four times within a fraction of a millisecond and never waits
    # for a periodic sweep, so success here means the over-limit path itself reaped the dead holder.
    holder = cli.popen("init", "alloc", "48m", "hold", env=LIMIT)
    wait_line(holder, "hold")
    holder.send_signal(signal.SIGKILL)  # not reaped yet: the process is a zombie while we allocate
    r = cli.run("init", "alloc", "48m", env=LIMIT)
    holder.wait()
    assert r.codes("alloc") == [CUDA_SUCCESS]


def test_sigkill_at_random_instants_leaves_nothing_charged(cli):
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "8m"}
    rng = random.Random(7)
    for _ in range(3):
        procs = [cli.popen("init", "loop", "1000000", "1m", env=env) for _ in range(4)]
        for p in procs:  # each is in its allocate/free loop
            wait_line(p, "init")
        for p in procs:
            time.sleep(rng.uniform(0, 0.05))  # a random instant inside the loop, not a synchronisation
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        # An allocation of the whole limit forces a sweep of dead slots when it does not fit, so
        # it must succeed at once, however recently the last periodic sweep ran.
        r = cli.run("init", "alloc", "8m", "meminfo", env=env, timeout=5)
        assert r.codes("alloc") == [CUDA_SUCCESS]
        assert r.op(2) == ["meminfo", "0", "0", str(8 * MIB)]
    # A process stays charged until it is gone (not zeroed by its own exit handler): the next one
    # reaps the last one's slot when it claims its own, and finds the whole limit free.
    r = cli.run("init", "meminfo", env=env, timeout=5)
    assert r.op(1) == ["meminfo", "0", str(8 * MIB), str(8 * MIB)]
    region = read_region(cli.cache)
    assert all(sum(s.used) == 0 for s in region.slots)
    assert sum(1 for s in region.slots if s.pid) <= 1  # that last process's own slot


def test_forked_child_has_its_own_slot_and_the_same_limit(cli):
    r = cli.run("init", "alloc", "40m", "fork_alloc", "40m", "fork_alloc", "24m", env=LIMIT)
    assert [ln for ln in r.lines if ln[0] == "child"] == [["child", "2"], ["child", "0"]]


def test_visible_devices_subset_charges_the_physical_device(cli):
    env = {"FAKE_GPU_COUNT": "2", "CUDA_DEVICE_MEMORY_LIMIT_0": "32m", "CUDA_DEVICE_MEMORY_LIMIT_1": "64m"}
    for visible in ("1", "GPU-face0001"):
        cli.cache.unlink(missing_ok=True)
        r = cli.run(
            "init", "count", "meminfo", "alloc", "64m", "alloc", "1", "nvmlmem", "0", "nvmlmem", "1",
            env={**env, "CUDA_VISIBLE_DEVICES": visible},
        )  # fmt: skip
        assert r.op(1) == ["count", "0", "1"]
        assert r.op(2) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]
        assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
        assert r.op(5) == ["nvmlmem", "0", str(32 * MIB), "0", str(32 * MIB)]
        assert r.op(6) == ["nvmlmem", "0", str(64 * MIB), str(64 * MIB), "0"]


def test_region_layout_for_the_monitor(cli):
    holder = cli.popen(
        "init",
        "alloc",
        "10m",
        "managed",
        "2m",
        "hold",
        env={**LIMIT, "CUDA_TASK_PRIORITY": "0", "FAKE_CTX_MIB": "20"},
    )
    wait_line(holder, "hold")
    region = read_region(cli.cache)
    holder.kill()
    holder.wait()
    assert (region.magic, region.major, region.minor) == (0x55504756, 2, 2)
    assert region.priority == 0
    assert region.device_count == 1
    dev = region.devices[0]
    assert (dev.uuid, dev.limit_bytes, dev.sm_limit, dev.phys_index) == (
        "GPU-face0000-0000-0000-0000-000000000000", 64 * MIB, 100, 0)  # fmt: skip
    mine = [s for s in region.slots if s.pid == holder.pid]
    assert len(mine) == 1
    assert (mine[0].used[0], mine[0].data[0], mine[0].context[0]) == (32 * MIB, 12 * MIB, 20 * MIB)


def test_foreign_region_file_is_left_alone_and_limits_still_hold(cli):
    hami = (19920718).to_bytes(4, "little") + bytes(2008948)  # a HAMi-core 1.x region
    cli.cache.write_bytes(hami)
    r = cli.run("init", "alloc", "64m", "alloc", "1", env=LIMIT)
    assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert "unusable (magic 0x12ff74e major 0" in r.error_lines()[0]
    assert cli.cache.read_bytes() == hami

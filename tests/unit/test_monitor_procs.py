"""Slot liveness: real processes (alive, exited, zombie, reused pid) and a fake /proc with PID namespaces."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from device_plugin.monitor.procs import ProcTable, read_stat
from tests.unit.monitor_files import self_start_time


def _wait_state(pid: int, state: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = read_stat("/proc", pid)
        if st is not None and st.state == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never reached state {state}")


def test_this_process_is_alive_with_its_start_time():
    t = ProcTable()
    me = os.getpid()
    assert t.libvgpu_alive(me, self_start_time())
    assert t.libvgpu_alive(me, 0)  # unknown start time: the pid alone decides
    assert not t.libvgpu_alive(me, self_start_time() + 1)  # same pid, another process (pid reuse)
    assert t.hami_alive(me, 0)
    assert t.hami_alive(12345678, me)  # hostpid wins over the container pid


def test_exited_and_zombie_processes_are_dead():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    _wait_state(p.pid, "Z")  # exited, not yet reaped by us: a zombie
    t = ProcTable()
    assert not t.libvgpu_alive(p.pid, 0)
    assert not t.hami_alive(p.pid, 0)
    p.wait()
    t = ProcTable()
    assert not t.libvgpu_alive(p.pid, 0)
    assert not t.hami_alive(0, p.pid)


def test_a_running_child_is_alive_until_killed():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _wait_state(p.pid, "S")
        start = read_stat("/proc", p.pid).starttime
        assert ProcTable().libvgpu_alive(p.pid, start)
        p.kill()
        p.wait()
        assert not ProcTable().libvgpu_alive(p.pid, start)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _fake_proc(
    root: Path, pid: int, *, state: str, start: int, nspid: list[int], comm: str = "py thon)"
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    fields = [state, "1", *["0"] * 17, str(start), "0"]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (d / "status").write_text(f"Name:\tx\nState:\t{state}\nNSpid:\t{' '.join(map(str, nspid))}\n")


def test_container_pids_are_found_through_nspid(tmp_path):
    # Host pid 5000 is pid 42 inside its container; host pid 42 is another, unrelated process.
    _fake_proc(tmp_path, 5000, state="S", start=777, nspid=[5000, 42])
    _fake_proc(tmp_path, 42, state="S", start=5, nspid=[42])
    _fake_proc(tmp_path, 6000, state="Z", start=888, nspid=[6000, 43])  # a zombie in a container
    t = ProcTable(str(tmp_path))
    assert t.libvgpu_alive(42, 777)  # not host pid 42 (start 5): the container's pid 42
    assert t.libvgpu_alive(42, 5)  # host pid 42 itself
    assert not t.libvgpu_alive(42, 999)
    assert not t.libvgpu_alive(43, 888)  # zombie
    assert not t.libvgpu_alive(44, 0)
    assert t.hami_alive(42, 0) and not t.hami_alive(43, 0)
    assert t.hami_alive(1, 5000) and not t.hami_alive(1, 6000)


def test_stat_with_odd_command_names_and_garbage(tmp_path):
    _fake_proc(tmp_path, 7, state="R", start=31, nspid=[7], comm="a) (b")
    assert read_stat(str(tmp_path), 7).starttime == 31
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").write_text("garbage")
    assert read_stat(str(tmp_path), 8) is None
    assert read_stat(str(tmp_path), 9) is None

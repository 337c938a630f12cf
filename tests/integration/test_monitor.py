"""The monitor as its own process against the in-memory API server, reading real region files:

* processes under libvgpu (CPU harness: fake libcuda, real LD_PRELOAD) hold memory in a
  ``<podUID>_<container>`` directory; the monitor exports exactly the bytes held and the limit, with
  the pod's namespace and name; after ``kill -9`` of a holder its bytes are gone in the first scan
  that starts after the kill;
* HAMi-core v1 and v0 files, garbage files (counted by reason), fake host figures;
* a directory of a deleted pod is removed after the grace period; one of an existing pod never is.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.monitor.procs import ProcTable
from device_plugin.monitor.regions import read_region
from tests.ci import skip_or_fail
from tests.unit.monitor_files import V0, V1, HProc, hami_bytes, write

REPO = Path(__file__).resolve().parents[2]
LIBVGPU = REPO / "libvgpu"
BUILD = LIBVGPU / "build"
MIB = 1 << 20
NODE = "node1"
SCAN_S = 0.3


@pytest.fixture(scope="module")
def harness() -> Path:
    """libvgpu.so, the fake driver and t_cli (the same build as tests/libvgpu)."""
    if not shutil.which(os.environ.get("CC", "gcc")) and not shutil.which("cc"):
        skip_or_fail("no C compiler (gcc or cc) to build libvgpu's test harness")
    subprocess.run(
        ["make", "-s", "-C", str(LIBVGPU), "test-bins"], check=True, capture_output=True, text=True
    )
    return BUILD


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def wait_for(port: int, cond: Callable[[dict], object], timeout: float = 30.0, what: str = "") -> dict:
    deadline = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < deadline:
        try:
            last = scrape(port)
        except OSError:
            time.sleep(0.05)
            continue
        if cond(last):
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or cond}; last scrape: {sorted(last)[:40]}")


def series(got: dict, name: str, **labels: str) -> dict[frozenset, float]:
    """Samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {lbl: v for (n, lbl), v in got.items() if n == name and want <= set(lbl)}


def value(got: dict, name: str, **labels: str) -> float | None:
    found = series(got, name, **labels)
    assert len(found) <= 1, found
    return next(iter(found.values()), None)


def create_pod(kube, name: str, namespace: str, containers: list[str]) -> str:
    pod = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": NODE, "containers": [{"name": c, "image": "x"} for c in containers]},
    }
    return kube.create_pod(pod, namespace=namespace)["metadata"]["uid"]


class Holder:
    """t_cli under libvgpu: allocates, prints ``hold 0`` and waits forever."""

    def __init__(self, build: Path, cache: Path, state: Path, *ops: str, limit: str = "64m") -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "FAKE_", "LIBVGPU_", "LD_"))}
        env.update(
            LD_LIBRARY_PATH=str(build / "fake"),
            LD_PRELOAD=str(build / "libvgpu.so"),
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache),
            CUDA_DEVICE_MEMORY_LIMIT=limit,
            FAKE_GPU_STATE=str(state),
            LIBCUDA_LOG_LEVEL="1",
        )
        self.proc = subprocess.Popen(
            [str(build / "tests" / "t_cli"), "init", *ops, "hold"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = ""
        while not line.startswith("hold"):
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise AssertionError(f"holder exited: {self.proc.stderr.read()}")
        self.lines = line

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)  # not reaped here: a zombie until stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        h.stop()


@pytest.fixture
def monitor_factory(kubeconfig: str, tmp_path: Path):
    procs: list[subprocess.Popen] = []

    def start(containers: Path, *extra: str, cards: str | None = None) -> int:
        port = free_port()
        argv = [sys.executable, "-m", "device_plugin.monitor", "--node-name", NODE, "--containers-dir",
                str(containers), "--kubeconfig", kubeconfig, "--address", "127.0.0.1", "--port", str(port),
                "--backend", "fake", "--scan-interval", str(SCAN_S), *extra]  # fmt: skip
        if cards:
            argv += ["--fake-config", cards]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HAMI_MONITOR_"))}
        log = open(tmp_path / f"monitor-{port}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        wait_for(port, lambda g: value(g, "hami_monitor_pods_synced") == 1, what="monitor synced")
        return port

    yield start
    for p in procs:
        p.send_signal(signal.SIGTERM)
        try:
            assert p.wait(10) == 0
        finally:
            if p.poll() is None:
                p.kill()


def test_exports_exactly_the_bytes_held_and_drops_killed_holders_within_one_scan(
    harness, kube_client, monitor_factory, holders, tmp_path
):
    containers = tmp_path / "containers"
    uid = create_pod(kube_client, "train-0", "team-a", ["main"])
    d = containers / f"{uid}_main"
    d.mkdir(parents=True)
    cache = d / f"{uuid.uuid4()}.cache"  # named as the device plugin names it
    state = tmp_path / "fakegpu.state"
    holders.append(Holder(harness, cache, state, "alloc", "40m"))
    holders.append(Holder(harness, cache, state, "alloc", "8m", "alloc", "4m"))
    gpu = read_region(cache, ProcTable()).devices[0].uuid
    assert gpu.startswith("GPU-")
    port = monitor_factory(containers)

    ctr = {"namespace": "team-a", "pod": "train-0", "container": "main", "vdevice_index": "0",
           "device_uuid": gpu, "zone": "vGPU"}  # fmt: skip
    got = wait_for(
        port, lambda g: value(g, "hami_vgpu_memory_used_bytes", **ctr) == 52 * MIB, what="52 MiB used"
    )
    assert value(got, "hami_vgpu_memory_limit_bytes", **ctr) == 64 * MIB
    assert value(got, "hami_container_device_memory_bytes", **ctr) == 52 * MIB
    assert value(got, "hami_vgpu_memory_buffer_bytes", **ctr) == 52 * MIB
    assert value(got, "hami_vgpu_memory_context_bytes", **ctr) == 0
    assert value(got, "hami_monitor_containers", state="exported") == 1

    killed_at = time.time()
    holders[0].kill9()
    # The first scan that starts after the kill must already leave the 40 MiB out.
    got = wait_for(port, lambda g: value(g, "hami_monitor_last_scan_timestamp_seconds") > killed_at,
                   timeout=10 * SCAN_S + 10, what="a scan after the kill")  # fmt: skip
    assert value(got, "hami_vgpu_memory_used_bytes", **ctr) == 12 * MIB
    killed_at = time.time()
    holders[1].kill9()
    got = wait_for(port, lambda g: value(g, "hami_monitor_last_scan_timestamp_seconds") > killed_at,
                   timeout=10 * SCAN_S + 10, what="a scan after the second kill")  # fmt: skip
    assert value(got, "hami_vgpu_memory_used_bytes", **ctr) == 0
    assert value(got, "hami_vgpu_memory_limit_bytes", **ctr) == 64 * MIB  # the container is still there


def test_hami_core_files_garbage_host_figures_and_grace_removal(kube_client, monitor_factory, tmp_path):
    containers = tmp_path / "containers"
    me = os.getpid()  # the slots' process: this test process, alive
    uid1 = create_pod(kube_client, "legacy-v1", "team-b", ["app"])
    uid0 = create_pod(kube_client, "legacy-v0", "team-b", ["app"])
    uid_bad = create_pod(kube_client, "broken", "team-b", ["app"])
    u1, u0 = "GPU-11111111-2222-3333-4444-555555555555", "GPU-00000000-2222-3333-4444-555555555555"
    write(containers / f"{uid1}_app" / "x.cache",
          hami_bytes(V1, [u1], [3000 * MIB], [HProc(me, used=[(2 * MIB, 1 * MIB, 97 * MIB, 0, 100 * MIB)],
                                                    sm_util=[42]), HProc(2**22 + 7, used=[(0, 0, 0, 0, MIB)])],
                     last_kernel_time=int(time.time()) - 30))  # fmt: skip
    write(containers / f"{uid0}_app" / "x.cache",
          hami_bytes(V0, [u0], [1000 * MIB], [HProc(me, used=[(0, 0, 10 * MIB, 0, 10 * MIB)], sm_util=[3])]))  # fmt: skip
    write(containers / f"{uid_bad}_app" / "x.cache", b"\x13\x37" * 5000)
    gone = containers / f"{uuid.uuid4()}_app"  # a pod that no longer exists
    write(gone / "x.cache", b"")
    for d in (gone, containers / f"{uid1}_app"):
        os.utime(d, (time.time() - 3600, time.time() - 3600))  # both old; only the gone one may go
    cards = tmp_path / "cards.yaml"
    cards.write_text(f"cards:\n  - {{uuid: {u1}, index: 0, model: NVIDIA H200, memory_used_mib: 4321, "
                     "utilization: 63, memory_utilization: 21}\n")  # fmt: skip
    port = monitor_factory(containers, "--grace-period", "1", "--legacy-metrics", cards=str(cards))

    v1 = {
        "namespace": "team-b",
        "pod": "legacy-v1",
        "container": "app",
        "vdevice_index": "0",
        "device_uuid": u1,
    }
    got = wait_for(
        port, lambda g: value(g, "hami_vgpu_memory_used_bytes", **v1) is not None, what="v1 series"
    )
    assert value(got, "hami_vgpu_memory_used_bytes", **v1) == 100 * MIB
    assert value(got, "hami_vgpu_memory_limit_bytes", **v1) == 3000 * MIB
    assert value(got, "hami_vgpu_memory_context_bytes", **v1) == 2 * MIB
    assert value(got, "hami_vgpu_memory_module_bytes", **v1) == 1 * MIB
    assert value(got, "hami_container_device_utilization_ratio", **v1) == 42
    assert 29 <= value(got, "hami_container_last_kernel_elapsed_seconds", **v1) <= 60
    v0 = {**v1, "pod": "legacy-v0", "device_uuid": u0}
    assert value(got, "hami_vgpu_memory_used_bytes", **v0) == 10 * MIB
    assert value(got, "hami_vgpu_memory_limit_bytes", **v0) == 1000 * MIB
    assert value(got, "hami_container_last_kernel_elapsed_seconds", **v0) is None
    assert value(got, "vGPU_device_memory_usage_in_bytes", podname="legacy-v0", deviceuuid=u0) == 10 * MIB
    assert value(got, "hami_monitor_cache_errors_total", reason="bad_magic") == 1
    host = {"node": NODE, "device_index": "0", "device_uuid": u1, "device_type": "NVIDIA-NVIDIA H200"}
    assert value(got, "hami_host_gpu_memory_used_bytes", **host) == 4321 * MIB
    assert value(got, "hami_host_gpu_utilization_ratio", **host) == 63
    assert value(got, "HostCoreUtilization", nodeid=NODE, deviceuuid=u1) == 63

    got = wait_for(
        port, lambda g: value(g, "hami_monitor_cache_dirs_removed_total") == 1, what="stale dir removed"
    )
    assert not gone.exists()
    assert (containers / f"{uid1}_app").exists()  # old, but its pod exists
    # Delete a pod through the API: its directory goes after the grace period, the others stay.
    kube_client.delete_pod("team-b", "legacy-v0")
    wait_for(
        port,
        lambda g: value(g, "hami_monitor_cache_dirs_removed_total") == 2,
        what="deleted pod's dir removed",
    )
    assert not (containers / f"{uid0}_app").exists()
    assert (containers / f"{uid1}_app").exists() and (containers / f"{uid_bad}_app").exists()
    got = scrape(port)
    assert value(got, "hami_vgpu_memory_used_bytes", **v0) is None
    assert value(got, "hami_vgpu_memory_used_bytes", **v1) == 100 * MIB


def test_utilisation_comes_from_libvgpus_measured_busy_time(
    harness, kube_client, monitor_factory, holders, tmp_path
):
    """A compute-limited container (SM 50 %) burning modelled kernels on the fake GPU: the monitor's
    utilisation rises above 0, stays near the cap, and falls to 0 once the container idles."""
    containers = tmp_path / "containers"
    uid = create_pod(kube_client, "burner", "team-c", ["main"])
    d = containers / f"{uid}_main"
    d.mkdir(parents=True)
    cache = d / "x.cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "FAKE_", "LIBVGPU_", "LD_"))}
    env.update(
        LD_LIBRARY_PATH=str(harness / "fake"), LD_PRELOAD=str(harness / "libvgpu.so"),
        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache), CUDA_DEVICE_SM_LIMIT="50", FAKE_KERNEL_US="1000",
        LIBVGPU_SM_SLICE_MS="20", FAKE_GPU_STATE=str(tmp_path / "state"), LIBCUDA_LOG_LEVEL="1",
    )  # fmt: skip
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [str(harness / "tests" / "t_cli"), "init", "alloc", "4m", "waitfile", str(go), "burn", "6000", "hold"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not cache.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = monitor_factory(containers, "--scan-interval", "1")
        ctr = {"pod": "burner", "container": "main"}
        got = wait_for(
            port, lambda g: value(g, "hami_vgpu_memory_used_bytes", **ctr) == 4 * MIB, what="4 MiB"
        )
        assert value(got, "hami_container_device_utilization_ratio", **ctr) in (
            None,
            0,
        )  # nothing launched yet
        go.touch()
        seen: list[float] = []

        def busy(g: dict) -> bool:
            v = value(g, "hami_container_device_utilization_ratio", **ctr)
            if v is not None:
                seen.append(v)
            return v is not None and v > 5

        got = wait_for(port, busy, timeout=20, what="utilisation above 5 %")
        assert value(got, "hami_container_last_kernel_elapsed_seconds", **ctr) <= 5
        line = ""
        while not line.startswith("burn"):  # init, alloc, waitfile lines come first
            line = proc.stdout.readline()
            assert line, "t_cli ended before its burn line"
        assert line.split()[1] == "0", line

        def idle(g: dict) -> bool:
            v = value(g, "hami_container_device_utilization_ratio", **ctr)
            seen.append(v)
            return v == 0

        wait_for(port, idle, what="idle")
        assert 5 < max(seen) <= 70, seen  # the cap is 50 %; one 20 ms slice of attribution slack
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--kubeconfig", "/nonexistent/kubeconfig", "--backend", "fake"],
            "cannot start: kubeconfig '/nonexistent",
        ),
        (["--backend", "fake", "--fake-config", "/nonexistent/cards.yaml"], "cannot start: --fake-config"),
        (["--scan-interval", "soon"], "argument --scan-interval: 'soon' is not a duration"),
    ],
)
def test_start_errors_are_one_line_without_traceback(argv, message):
    p = subprocess.run(
        [sys.executable, "-m", "device_plugin.monitor", "--node-name", "n", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr

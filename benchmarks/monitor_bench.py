"""Scrape time and memory of the node monitor with many containers on one node (generated region files).

Generates `--containers` cache directories ``<podUID>_main`` (every fourth a HAMi-core v1 file, the
rest libvgpu 2.x files), each with two process slots: one alive (this process) and one whose pid does
not exist, so every scan also checks a dead pid and builds the PID-namespace index once, as on a real
node. Creates the same number of pods on this node in an in-memory API server, then:

1. in process: times `Scanner.scan()` + rendering of the families (what the scan thread does every
   scan interval), `--scans` times;
2. as a separate process (``python -m device_plugin.monitor``, as deployed): waits until every
   container is exported, scrapes ``/metrics`` `--scrapes` times over HTTP while its scans keep
   running every `--scan-interval` seconds (default 5, the monitor's default; 1 makes most scrapes
   meet a scan) and reads the monitor's resident memory (VmRSS, VmHWM) from /proc.

    python benchmarks/monitor_bench.py [--containers 1000] [--scrapes 300] [--scans 30] [--scan-interval 5]

Target: p99 scrape <= 100 ms with 1000 containers on the 2-core development machine.
Prints figures; never part of the tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from device_plugin.monitor.metrics import render_snapshot  # noqa: E402
from device_plugin.monitor.pods import PodIndex  # noqa: E402
from device_plugin.monitor.scanner import Scanner  # noqa: E402
from hami.kube import KubeClient  # noqa: E402
from kubefakes.apiserver import FakeApiServer  # noqa: E402
from tests.unit.monitor_files import V1, HProc, VDev, VSlot, hami_bytes, libvgpu_bytes, self_start_time, write  # noqa: E402

MIB = 1 << 20
NODE = "bench-node"


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def generate(root: Path, uids: list[str]) -> None:
    me, start = os.getpid(), self_start_time()
    for i, uid in enumerate(uids):
        gpu = f"GPU-{i % 8:08x}-0000-4000-8000-000000000000"
        dead = 4_000_000 + i  # above the default pid_max: never alive
        if i % 4 == 3:
            data = hami_bytes(
                V1, [gpu], [8000 * MIB],
                [HProc(me, used=[(10 * MIB, 1 * MIB, 500 * MIB, 0, 511 * MIB)], sm_util=[20]),
                 HProc(dead, used=[(0, 0, 0, 0, 64 * MIB)])],
                last_kernel_time=int(time.time()),
            )  # fmt: skip
        else:
            data = libvgpu_bytes(
                [VDev(gpu, limit=8000 * MIB, sm_limit=30, phys_index=0, busy_ns=i * 1000, last_kernel=int(time.time()))],
                [VSlot(me, start, used=[300 * MIB], data=[290 * MIB], context=[10 * MIB]),
                 VSlot(dead, 1, used=[100 * MIB])],
            )  # fmt: skip
        write(root / f"{uid}_main" / "vgpu.cache", data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--containers", type=int, default=1000)
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--scans", type=int, default=30)
    ap.add_argument("--scan-interval", type=float, default=5.0, help="the monitor process's --scan-interval")
    args = ap.parse_args()
    n = args.containers
    print(f"before: {load()}")

    server = FakeApiServer().start()
    tmp = Path(tempfile.mkdtemp(prefix="monitor-bench-"))
    proc = None
    try:
        kube = KubeClient.from_kubeconfig(server.kubeconfig_path)
        uids = []
        for i in range(n):
            pod = {"metadata": {"name": f"p{i}", "namespace": f"ns{i % 20}"},
                   "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]}}  # fmt: skip
            uids.append(kube.create_pod(pod)["metadata"]["uid"])
        containers = tmp / "containers"
        generate(containers, uids)
        size = sum(f.stat().st_size for f in containers.rglob("*.cache"))
        print(f"generated {n} containers ({size / MIB:.0f} MiB of region files) under {containers}")

        # 1. the scan thread's work, in process
        index = PodIndex()
        index.on_sync(kube.list("pods", field_selector=f"spec.nodeName={NODE}"))
        scanner = Scanner(containers, index)
        scans, renders, lines = [], [], 0
        for _ in range(args.scans):
            t0 = time.perf_counter()
            snap = scanner.scan()
            t1 = time.perf_counter()
            text = render_snapshot(snap, node=NODE)
            t2 = time.perf_counter()
            scans.append(t1 - t0)
            renders.append(t2 - t1)
            lines = text.count(b"\n")
        assert len(snap.containers) == n, len(snap.containers)
        print(
            f"scan (read {n} regions + /proc): p50 {statistics.median(scans) * 1e3:.1f} ms, "
            f"p99 {pct(scans, 99) * 1e3:.1f} ms; render ({lines} lines): p50 {statistics.median(renders) * 1e3:.1f} ms, "
            f"p99 {pct(renders, 99) * 1e3:.1f} ms  [{args.scans} scans]"
        )

        # 2. the deployed process, scraped over HTTP
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HAMI_MONITOR_"))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "device_plugin.monitor", "--node-name", NODE, "--containers-dir", str(containers),
             "--kubeconfig", server.kubeconfig_path, "--address", "127.0.0.1", "--port", str(port),
             "--backend", "fake", "--scan-interval", str(args.scan_interval), "--log-level", "WARNING"],
            cwd=REPO, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            try:
                _, body = scrape(port)
                if f'hami_monitor_containers{{state="exported"}} {n}.0'.encode() in body:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("monitor did not export every container within 120 s")
            time.sleep(0.2)
        times = []
        for _ in range(args.scrapes):
            dt, body = scrape(port)
            times.append(dt)
            time.sleep(0.02)
        mem = rss_kib(proc.pid)
        nlines = body.count(b"\n")
        print(
            f"scrape /metrics ({len(body) / 1024:.0f} KiB, {nlines} lines): "
            f"p50 {statistics.median(times) * 1e3:.1f} ms, p90 {pct(times, 90) * 1e3:.1f} ms, "
            f"p99 {pct(times, 99) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms  [{args.scrapes} scrapes "
            f"over {sum(times) + 0.02 * args.scrapes:.0f} s, scans every {args.scan_interval:g} s meanwhile]"
        )
        print(
            f"monitor memory: VmRSS {mem['VmRSS'] / 1024:.1f} MiB, VmHWM (peak) {mem['VmHWM'] / 1024:.1f} MiB"
        )
        print(f"after: {load()}")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

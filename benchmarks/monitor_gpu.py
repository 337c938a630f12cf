"""The node monitor on a real GPU, its figures next to nvidia-smi's (run by benchmarks/monitor_gpu.sh).

1. An in-memory API server holds one pod ``bench/torch-0`` on this node; its cache directory
   ``<containers>/<podUID>_main/<uuid>.cache`` is laid out as the device plugin lays it out.
2. ``hami-vgpu-monitor`` (``python -m device_plugin.monitor``, ``--backend nvidia``, 1 s scans) runs
   as its own process against that server.
3. A PyTorch process under ``libvgpu.so`` (``CUDA_DEVICE_MEMORY_LIMIT=--limit-mib``,
   ``CUDA_DEVICE_SM_LIMIT=--sm``) allocates ``--hold-mib`` MiB, idles, then runs bf16 matmuls for
   ``--burn-s`` seconds, then holds until it is killed with SIGKILL.
4. At each phase the monitor's series and ``nvidia-smi --query-compute-apps`` /
   ``--query-gpu`` are printed side by side; the raw scrapes are written to $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hami.kube import KubeClient  # noqa: E402
from kubefakes.apiserver import FakeApiServer  # noqa: E402

MIB = 1 << 20
NODE = os.environ.get("NODE_NAME", "gpu-node")

HOLDER = r"""
import sys, time, torch
hold_mib, burn_s = int(sys.argv[1]), float(sys.argv[2])
x = torch.empty(hold_mib << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"held allocated={torch.cuda.memory_allocated() >> 20}MiB reserved={torch.cuda.memory_reserved() >> 20}MiB "
      f"mem_get_info total={total >> 20}MiB free={free >> 20}MiB", flush=True)
print("phase idle", flush=True)
time.sleep(8)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print(f"phase burn reserved={torch.cuda.memory_reserved() >> 20}MiB", flush=True)
t0 = time.time()
while time.time() - t0 < burn_s:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
print(f"phase hold reserved={torch.cuda.memory_reserved() >> 20}MiB", flush=True)
while True:
    time.sleep(60)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def series(text: str, prefixes: tuple[str, ...]) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefixes)]


def smi(query: str) -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-{query}", "--format=csv"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"


def report(label: str, port: int, out: Path, holder_pid: int | None) -> None:
    text = scrape(port)
    (out / f"scrape_{label}.txt").write_text(text)
    print(f"\n=== {label} (unix {time.time():.0f}, holder pid {holder_pid}) ===")
    print("-- monitor (hami-vgpu-monitor /metrics):")
    for ln in series(
        text, ("hami_vgpu_memory_", "hami_container_", "hami_host_gpu_", "hami_monitor_containers")
    ):
        print("  " + ln)
    print("-- nvidia-smi --query-compute-apps=pid,process_name,used_memory:")
    for ln in smi("compute-apps=pid,process_name,used_memory").splitlines():
        print("  " + ln)
    print("-- nvidia-smi --query-gpu=index,uuid,name,memory.used,utilization.gpu,utilization.memory:")
    for ln in smi("gpu=index,uuid,name,memory.used,utilization.gpu,utilization.memory").splitlines():
        print("  " + ln)
    sys.stdout.flush()


def wait_scan_after(port: int, t: float, timeout: float = 30) -> None:
    """Until a scan that started after unix time `t` is published."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ln in scrape(port).splitlines():
            if ln.startswith("hami_monitor_last_scan_timestamp_seconds ") and float(ln.split()[1]) > t:
                return
        time.sleep(0.2)
    raise SystemExit("no scan published in time")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hold-mib", type=int, default=4096)
    ap.add_argument("--limit-mib", type=int, default=8000)
    ap.add_argument("--sm", type=int, default=30)
    ap.add_argument("--burn-s", type=float, default=20)
    ap.add_argument("--lib", default=str(REPO / "libvgpu" / "build" / "libvgpu.so"))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/monitor-gpu"))
    ap.add_argument("--cpu-harness", action="store_true",
                    help="dry run without a GPU: the fake driver and t_cli hold the memory, --backend fake")  # fmt: skip
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    server = FakeApiServer().start()
    kube = KubeClient.from_kubeconfig(server.kubeconfig_path)
    pod = {"metadata": {"name": "torch-0", "namespace": "bench"},
           "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "pytorch"}]}}  # fmt: skip
    uid = kube.create_pod(pod)["metadata"]["uid"]
    containers = out / "containers"
    cdir = containers / f"{uid}_main"
    cdir.mkdir(parents=True, exist_ok=True)
    cache = cdir / f"{uuid.uuid4()}.cache"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "HAMI_MONITOR_"))}
    mon_log = open(out / "monitor.log", "w")  # noqa: SIM115
    monitor = subprocess.Popen(
        [sys.executable, "-m", "device_plugin.monitor", "--node-name", NODE, "--containers-dir", str(containers),
         "--kubeconfig", server.kubeconfig_path, "--address", "127.0.0.1", "--port", str(port),
         "--backend", "fake" if args.cpu_harness else "nvidia", "--scan-interval", "1"],
        cwd=REPO, env=env, stdout=mon_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    holder = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if "hami_monitor_pods_synced 1.0" in scrape(port):
                    break
            except OSError:
                pass
            if monitor.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"monitor did not start; see {out / 'monitor.log'}")
            time.sleep(0.2)
        print(f"monitor on port {port}, pod bench/torch-0 uid {uid}, cache {cache}")
        print(
            f"holder: {args.hold_mib} MiB under CUDA_DEVICE_MEMORY_LIMIT={args.limit_mib}m CUDA_DEVICE_SM_LIMIT={args.sm}"
        )
        henv = {**env, "LD_PRELOAD": args.lib, "CUDA_DEVICE_MEMORY_LIMIT": f"{args.limit_mib}m",
                "CUDA_DEVICE_SM_LIMIT": str(args.sm), "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache),
                "LIBCUDA_LOG_LEVEL": "1"}  # fmt: skip
        cmd = [sys.executable, "-c", HOLDER, str(args.hold_mib), str(args.burn_s)]
        if args.cpu_harness:
            build = REPO / "libvgpu" / "build"
            henv.update(LD_LIBRARY_PATH=str(build / "fake"), FAKE_GPU_STATE=str(out / "fakegpu.state"))
            t_cli = build / "tests" / "t_cli"
            cmd = ["sh", "-c", f'echo held; echo "phase idle"; exec {t_cli} init alloc {args.hold_mib}m hold']
        holder = subprocess.Popen(
            cmd,
            env=henv, stdout=subprocess.PIPE, stderr=open(out / "holder_stderr.log", "w"), text=True,  # noqa: SIM115
        )  # fmt: skip
        line = holder.stdout.readline().strip()
        print(f"holder says: {line}")
        assert holder.stdout.readline().strip() == "phase idle"
        wait_scan_after(port, time.time())
        report("idle_holding", port, out, holder.pid)
        line = holder.stdout.readline().strip()
        print(f"\nholder says: {line}")
        time.sleep(args.burn_s * 0.6)
        report("burning", port, out, holder.pid)
        line = holder.stdout.readline().strip()
        print(f"\nholder says: {line}")
        wait_scan_after(port, time.time())
        report("after_burn_holding", port, out, holder.pid)
        killed = time.time()
        os.kill(holder.pid, signal.SIGKILL)
        wait_scan_after(port, killed)
        print(f"\nkill -9 at unix {killed:.1f}; first scan after it:")
        report("after_kill9", port, out, None)
        holder.wait()
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
        monitor.send_signal(signal.SIGTERM)
        try:
            monitor.wait(10)
        except subprocess.TimeoutExpired:
            monitor.kill()
        server.stop()
    (out / "summary.json").write_text(json.dumps({"hold_mib": args.hold_mib, "limit_mib": args.limit_mib,
                                                  "sm": args.sm, "uid": uid}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

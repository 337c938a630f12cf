"""300 processes of one container initialise at once (CPU, fake driver): how long does each
take from exec to its first accounted allocation, and does the shared region stay consistent?

Why: HAMi-core serialised start-up behind a semaphore and a host-PID probe (~0.6 s x N,
core#243); libvgpu takes one fcntl lock for a few microseconds per process. Prints one JSON
line. Run from the repository root: python benchmarks/libvgpu_init_storm.py [--procs 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "libvgpu" / "build"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=300)
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(REPO / "libvgpu"), "test-bins"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_PRELOAD=str(BUILD / "libvgpu.so"), LD_LIBRARY_PATH=str(BUILD / "fake"),
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{tmp}/c", FAKE_GPU_STATE=f"{tmp}/s",
                   CUDA_DEVICE_MEMORY_LIMIT="1g", FAKE_GPU_MIB="4096")  # fmt: skip
        go = Path(tmp) / "go"
        cmd = [str(BUILD / "tests" / "t_cli"), "waitfile", str(go), "init", "alloc", "1m"]
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(a.procs)]
        time.sleep(1.0)  # all exec'd and waiting at the barrier
        t0 = time.monotonic()
        go.touch()
        done = []
        for p in procs:
            out, _ = p.communicate()
            done.append((time.monotonic() - t0, out))
        ok = sum("alloc 0 0" in out for _, out in done)
        times = sorted(t for t, _ in done)
    print(json.dumps({
        "bench": "libvgpu_init_storm", "procs": a.procs, "ok": ok,
        "all_done_s": round(times[-1], 3), "median_done_s": round(statistics.median(times), 3),
        "cpus": os.cpu_count(), "python": sys.version.split()[0],
    }))  # fmt: skip


if __name__ == "__main__":
    main()

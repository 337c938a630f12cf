"""The device plugin's MPS daemon supervision (`device_plugin.mps.daemon.MpsDaemon`) against the real
``nvidia-cuda-mps-control`` on a GPU: start it for the card (foreground, its own pipe and log
directories), run a client with the environment the plugin gives a container (`mps_env`, pipe and log
directories at their host paths, libvgpu preloaded when given), kill the daemon, wait for the plugin to
start it again, run the client again, and stop it through its pipe. The card's compute mode and MIG
mode are not touched. Prints JSON lines.

  python3 benchmarks/mps_daemon_check.py [--lib libvgpu.so] [--probe benchmarks/libvgpu_tenant.py]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from device_plugin.mps.daemon import MpsDaemon  # noqa: E402


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def client(d: MpsDaemon, lib: str | None, probe: str, sm: int, mem: int, seconds: float, tag: str) -> dict:
    """One tenant through the daemon, with the env the plugin's mps mode sets (host paths here)."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(d.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(d.log_dir),
           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mem}M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(sm),
           "CUDA_VISIBLE_DEVICES": d.card_uuid}  # fmt: skip
    if lib:
        env.update(LD_PRELOAD=lib, CUDA_DEVICE_MEMORY_LIMIT=f"{mem}m", CUDA_DEVICE_SM_LIMIT="0",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{d.dir}/{tag}.cache")  # fmt: skip
    with tempfile.TemporaryDirectory() as t:
        go = Path(t, "go")
        go.touch()
        p = subprocess.run(
            [sys.executable, probe, "--ready", f"{t}/r", "--go", str(go), "--seconds", str(seconds),
             "--label", f"{tag}:{sm}"], env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    out = {"rc": p.returncode}
    if p.stdout.strip():
        out.update(json.loads(p.stdout.strip().splitlines()[-1]))
    if p.returncode:
        out["stderr"] = p.stderr.strip().splitlines()[-3:]
    return out


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("--probe", default=str(Path(__file__).resolve().parent / "libvgpu_tenant.py"))
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.split()[0]  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="mps-root-"))
    d = MpsDaemon(uuid, root, backoff_s=(0.5, 2.0))
    task = asyncio.create_task(d.run())
    t0 = time.monotonic()
    ready = await d.ready(20)
    say(check="start", ready=ready, seconds=round(time.monotonic() - t0, 2), pid=d.proc.pid if d.proc else None,
        pipe=sorted(p.name for p in d.pipe_dir.iterdir()) if d.pipe_dir.exists() else [])  # fmt: skip
    if not ready:
        await d.stop()
        return 1
    r = await asyncio.to_thread(client, d, args.lib, args.probe, 50, 8000, args.seconds, "before")
    say(check="client", **r)
    first = d.proc.pid
    d.proc.kill()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20 and not (d.restarts and d.running and d.proc.pid != first):
        await asyncio.sleep(0.05)
    ready = await d.ready(20)
    say(check="restart", restarts=d.restarts, new_pid=d.proc.pid, old_pid=first, ready=ready,
        seconds=round(time.monotonic() - t0, 2))  # fmt: skip
    r = await asyncio.to_thread(client, d, args.lib, args.probe, 50, 8000, args.seconds, "after")
    say(check="client-after-restart", **r)
    await d.stop()
    await asyncio.wait_for(task, 30)
    say(
        check="stop",
        returncode=d.proc.returncode,
        control_left=(d.pipe_dir / "control").exists(),
        log=(d.log_dir / "control.log").read_text()[-600:] if (d.log_dir / "control.log").exists() else "",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

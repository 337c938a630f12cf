"""Two processes of one container share one memory limit: the one that goes over gets OOM,
the other keeps running.

Why: the per-container limit is only meaningful if it holds across processes (one shared
accounting region) and if hitting it hurts only the process that asked. Run under
LD_PRELOAD=libvgpu.so with CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_MEMORY_SHARED_CACHE set
(the same for both children, as in a container). Prints one JSON line.

  python3 libvgpu_two_proc.py [--hold-mib 5000] [--seconds 8]
"""

import argparse
import json
import subprocess
import sys
import time


def holder(hold_mib: int, seconds: float) -> None:
    import torch

    held = torch.empty(hold_mib << 20, dtype=torch.uint8, device="cuda")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    print("ready", flush=True)
    iters, t0, errors = 0, time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        try:
            (a @ a).sum().item()
            iters += 1
        except RuntimeError:
            errors += 1
    dt = time.perf_counter() - t0
    print(
        json.dumps(
            {"iters": iters, "errors": errors, "seconds": round(dt, 2), "held_mib": held.numel() >> 20}
        )
    )


def grabber() -> None:
    import torch

    blocks, held, err = [], 0, None
    while held < 200_000:
        try:
            blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
            held += 256
        except torch.OutOfMemoryError as e:
            err = type(e).__name__
            break
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"held_mib": held, "error": err, "total_mib": total >> 20, "free_mib": free >> 20}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", nargs="?", default="main", choices=["main", "holder", "grabber"])
    ap.add_argument("--hold-mib", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args()
    if a.role == "holder":
        return holder(a.hold_mib, a.seconds)
    if a.role == "grabber":
        return grabber()
    me = [sys.executable, __file__]
    h = subprocess.Popen(
        me + ["holder", "--hold-mib", str(a.hold_mib), "--seconds", str(a.seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert h.stdout.readline().strip() == "ready"
    g = subprocess.run(me + ["grabber"], capture_output=True, text=True, timeout=120)
    hout, _ = h.communicate(timeout=120)
    print(
        json.dumps(
            {
                "probe": "two_proc",
                "holder_rc": h.returncode,
                "holder": json.loads(hout.strip().splitlines()[-1]),
                "grabber_rc": g.returncode,
                "grabber": json.loads(g.stdout.strip().splitlines()[-1])
                if g.stdout.strip()
                else g.stderr[-300:],
            }
        )
    )


if __name__ == "__main__":
    main()

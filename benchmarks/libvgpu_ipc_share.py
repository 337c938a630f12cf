"""Two processes of one container share a CUDA tensor through torch.multiprocessing (legacy CUDA
IPC): the parent allocates it, the child opens it. Inside one container the tensor is charged once,
so a 3 GiB tensor under a 4 GiB limit can be shared; charged twice, the child's open fails.

Run under LD_PRELOAD=libvgpu.so with CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_MEMORY_SHARED_CACHE
set (the same for both processes, as in a container). The child allocates nothing on the device
(two contexts and the tensor fill the limit): it reads two bytes of the shared tensor. Prints one
JSON line: whether the import worked, the child's view of free memory, and the region's container
usage while both hold the tensor and after the child has exited (MiB).

  python3 benchmarks/libvgpu_ipc_share.py [--gib 3]
"""

import argparse
import json
import os
import struct
import time

import torch
import torch.multiprocessing as mp


def region_used_mib() -> int:
    """Sum of live slots' used[0] in the region file (layout 2.x, docs/libvgpu.md section 6)."""
    raw = open(os.environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"], "rb").read()
    (hwm,) = struct.unpack_from("<I", raw, 36)
    total = 0
    for s in range(min(hwm, 1024)):
        at = 8192 + 576 * s
        (pid,) = struct.unpack_from("<i", raw, at)
        if pid > 0:
            total += struct.unpack_from("<Q", raw, at + 16)[0]
    return total >> 20


def child(q, r, go) -> None:
    try:
        y = q.get()
        vals = [int(y[12345].item()), int(y[-1].item())]
        free, total = torch.cuda.mem_get_info()
        r.put({"import": "ok", "values": vals, "child_free_mib": free >> 20, "child_total_mib": total >> 20})
    except Exception as e:  # the import's OOM arrives as a RuntimeError while unpickling
        r.put({"import": repr(e)[:160]})
        return
    go.wait(60)
    del y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=3)
    args = ap.parse_args()
    mp.set_start_method("spawn")
    x = torch.full((args.gib << 30,), 7, dtype=torch.uint8, device="cuda")
    q, r, go = mp.Queue(), mp.Queue(), mp.Event()
    p = mp.Process(target=child, args=(q, r, go))
    p.start()
    q.put(x)
    res = r.get(timeout=120)
    res["region_used_mib_both"] = region_used_mib()
    go.set()
    p.join(60)
    time.sleep(0.2)
    res["region_used_mib_after_child"] = region_used_mib()
    res["gib"] = args.gib
    res["limit"] = os.environ.get("CUDA_DEVICE_MEMORY_LIMIT")
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()

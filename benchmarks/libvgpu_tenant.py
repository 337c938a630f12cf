"""One tenant of a shared-card measurement: bf16 matmul throughput over a window that starts when
every tenant is warm, so that tenants started as separate processes (separate containers in
production) overlap exactly. Prints one JSON line.

  python3 libvgpu_tenant.py --framework torch|jax --ready FILE --go FILE --seconds 10 --label NAME
      [--streams K]   (torch: the 4 matmuls of a step on K streams, each stream synchronised)
      [--sparse-ms MS] (torch: a sparse neighbour instead - one tiny kernel, a synchronise, MS ms idle)

Besides the window's throughput it reports `first_step_s` (from the go file to the first step
done: a limiter that carried debt from warm-up stalls here), `tflops_after_1s` (the window less
its first second) and the window's CLOCK_MONOTONIC start and end (`t0`, `t1`, seconds), so a
driver can chain processes.

After warming up the process creates FILE given by --ready, then waits for the --go file (the
driver script creates it once every tenant is ready).

Why its own probe: torch_probe.py measures from its own start, and framework import and
context creation take several seconds that differ between processes, so two of them would
overlap only partly. Warm-up (context, cuBLAS/XLA compilation, first kernels) happens before
the start instant.
"""

import argparse
import json
import os
import time


def torch_runner(n, streams=1):
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def step():
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()

    if streams <= 1:
        return step
    ss = [torch.cuda.Stream() for _ in range(streams)]

    def step_streams():
        for i in range(4):
            with torch.cuda.stream(ss[i % streams]):
                a @ b
        for s in ss:
            s.synchronize()

    return step_streams


def sparse_runner(ms):
    import torch

    x = torch.ones(16, device="cuda")

    def step():
        x.add_(1)
        torch.cuda.synchronize()
        time.sleep(ms / 1000)

    return step


def jax_runner(n):
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(k1, (n, n), dtype=jnp.bfloat16)
    b = jax.random.normal(k2, (n, n), dtype=jnp.bfloat16)
    mm = jax.jit(lambda x, y: x @ y)

    def step():
        outs = [mm(a, b) for _ in range(4)]
        outs[-1].block_until_ready()

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["torch", "jax"], default="torch")
    ap.add_argument("--ready", required=True)
    ap.add_argument("--go", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--sparse-ms", type=float, default=0)
    args = ap.parse_args()
    step = torch_runner(args.n, args.streams) if args.framework == "torch" else jax_runner(args.n)
    if args.sparse_ms > 0:
        step = sparse_runner(args.sparse_ms)
    for _ in range(3):
        step()
    open(args.ready, "w").close()
    waited = time.perf_counter()
    while not os.path.exists(args.go):
        time.sleep(0.005)
    waited = time.perf_counter() - waited
    iters, first, late, t0 = 0, None, 0, time.perf_counter()
    m0 = time.monotonic()
    while time.perf_counter() - t0 < args.seconds:
        step()
        iters += 4
        now = time.perf_counter() - t0
        if first is None:
            first = now
        if now > 1.0:
            late += 4
    dt = time.perf_counter() - t0
    m1 = time.monotonic()
    print(json.dumps({
        "bench": "tenant", "label": args.label, "framework": args.framework,
        "sm": os.environ.get("CUDA_DEVICE_SM_LIMIT", ""), "priority": os.environ.get("CUDA_TASK_PRIORITY", ""),
        "card_region": bool(os.environ.get("LIBVGPU_CARD_DIR")), "waited_s": round(waited, 2),
        "tflops": round(2 * args.n ** 3 * iters / dt / 1e12, 1), "iters": iters, "seconds": round(dt, 2),
        "streams": args.streams, "first_step_s": round(first or dt, 3),
        "tflops_after_1s": round(2 * args.n ** 3 * late / (dt - 1.0) / 1e12, 1) if dt > 1.5 else None,
        "t0": round(m0, 4), "t1": round(m1, 4),
    }), flush=True)


if __name__ == "__main__":
    main()

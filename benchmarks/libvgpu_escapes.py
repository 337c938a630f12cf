"""Ways a tenant could hold device memory past its libvgpu limit, run against the real driver.

Each scenario runs in a child process that talks to libcuda through ctypes (no framework),
once under LD_PRELOAD=libvgpu.so with CUDA_DEVICE_MEMORY_LIMIT (default 2g) and once without
libvgpu (the "before": what the driver lets the same program hold). While the child holds what
it got, the parent reads the card's used memory with nvidia-smi (outside any limit), so the
figure is the physical memory the scenario made the driver take, context excluded.

Scenarios:
  ctx       the primary context alone (what the other figures include)
  vmm       8 x (cuMemCreate 1 GiB, cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemRelease):
            NVIDIA's create/map/release idiom (NCCL's cuMem path)
  addrfree  1 GiB created, mapped, released, then cuMemAddressFree without cuMemUnmap: what the
            driver does with memory whose VA range goes while mapped
  graph     cuGraphAddMemAllocNode 6 GiB, instantiate, upload, launch
  capture   cuMemAllocAsync 6 GiB + cuMemFreeAsync captured on a stream, instantiate, launch
  heap      cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 6 GiB), then a kernel launch
  stack     cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 16 KiB), then a kernel launch

    python3 benchmarks/libvgpu_escapes.py --lib libvgpu/build/libvgpu.so --out results.json

Prints one line per scenario and mode; --out writes them as JSON lines. Needs one NVIDIA GPU
and nvidia-smi; no Python packages.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30
SCENARIOS = ["ctx", "vmm", "addrfree", "graph", "capture", "heap", "stack"]
PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry k() { ret; }
"""


# ---------------- child: one scenario against libcuda ----------------


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.calls: list[tuple[str, int]] = []

    def __call__(self, name: str, *args) -> int:
        fn = getattr(self.lib, name, None)
        rc = int(fn(*args)) if fn else -1  # -1: the driver lacks the entry point
        self.calls.append((name, rc))
        return rc


def _u64() -> ctypes.c_uint64:
    return ctypes.c_uint64(0)


def _prop(handle_types: int = 0) -> ctypes.Array:
    p = (ctypes.c_char * 32)()
    ctypes.memmove(ctypes.addressof(p), (ctypes.c_int * 4)(1, handle_types, 1, 0), 16)  # pinned, device 0
    return p


def _launch_kernel(cu: Cuda) -> int:
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    rc = cu("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(PTX))
    if rc == 0:
        rc = cu("cuModuleGetFunction", ctypes.byref(fn), mod, b"k")
    if rc == 0:
        rc = cu("cuLaunchKernel", fn, 132, 1, 1, 1024, 1, 1, 0, None, None, None)
    if rc == 0:
        rc = cu("cuCtxSynchronize")
    return rc


def scenario(name: str) -> dict:
    cu = Cuda()
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
    cu("cuInit", 0)
    cu("cuDeviceGet", ctypes.byref(dev), 0)
    cu("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    cu("cuCtxSetCurrent", ctx)
    out: dict = {"scenario": name}
    if name in ("vmm", "addrfree"):
        n = 8 if name == "vmm" else 1
        creates, keep = [], []
        access = (ctypes.c_int * 3)(1, 0, 3)  # device 0, read-write
        for _ in range(n):
            h, va = _u64(), _u64()
            rc = cu("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(GIB), _prop(), ctypes.c_ulonglong(0))
            creates.append(rc)
            if rc:
                continue
            cu("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(GIB), ctypes.c_size_t(0), ctypes.c_uint64(0),
               ctypes.c_ulonglong(0))  # fmt: skip
            cu("cuMemMap", va, ctypes.c_size_t(GIB), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
            cu("cuMemSetAccess", va, ctypes.c_size_t(GIB), access, ctypes.c_size_t(1))
            cu("cuMemRelease", h)
            keep.append(va)
        out["creates"] = creates
        if name == "addrfree" and keep:
            out["address_free"] = cu("cuMemAddressFree", keep[0], ctypes.c_size_t(GIB))
    elif name in ("graph", "capture"):
        graph, exe, stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        cu("cuStreamCreate", ctypes.byref(stream), 1)
        if name == "graph":
            cu("cuGraphCreate", ctypes.byref(graph), 0)
            params = (ctypes.c_char * 120)()
            ctypes.memmove(
                ctypes.addressof(params), (ctypes.c_int * 4)(1, 0, 1, 0), 16
            )  # pool props: device 0
            ctypes.c_uint64.from_buffer(params, 104).value = 6 * GIB
            node = ctypes.c_void_p()
            out["add_node"] = cu(
                "cuGraphAddMemAllocNode", ctypes.byref(node), graph, None, ctypes.c_size_t(0), params
            )
        else:
            p = _u64()
            cu("cuStreamBeginCapture_v2", stream, 0)
            out["captured_alloc"] = cu("cuMemAllocAsync", ctypes.byref(p), ctypes.c_size_t(6 * GIB), stream)
            cu("cuMemFreeAsync", p, stream)
            cu("cuStreamEndCapture", stream, ctypes.byref(graph))
        out["instantiate"] = cu(
            "cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_ulonglong(0)
        )
        reserved = _u64()
        if out["instantiate"] == 0:
            cu("cuDeviceGetGraphMemAttribute", dev, 2, ctypes.byref(reserved))
            out["reserved_after_instantiate"] = reserved.value
            out["upload"] = cu("cuGraphUpload", exe, stream)
            out["launch"] = cu("cuGraphLaunch", exe, stream)
            cu("cuStreamSynchronize", stream)
            cu("cuDeviceGetGraphMemAttribute", dev, 2, ctypes.byref(reserved))
            out["reserved_after_launch"] = reserved.value
    elif name in ("heap", "stack"):
        limit, value = (2, 6 * GIB) if name == "heap" else (0, 16 << 10)
        out["set_limit"] = cu("cuCtxSetLimit", limit, ctypes.c_size_t(value))
        got = ctypes.c_size_t(0)
        cu("cuCtxGetLimit", ctypes.byref(got), limit)
        out["limit_now"] = got.value
        out["physical_after_set_mib"] = None  # filled in by the parent
        print("STEP", flush=True)
        sys.stdin.readline()
        out["kernel"] = _launch_kernel(cu)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    cu("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    out["meminfo_free"], out["meminfo_total"] = free.value, total.value
    out["calls"] = [f"{n}={rc}" for n, rc in cu.calls if rc]
    return out


# ---------------- parent ----------------


def used_mib() -> int:
    q = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
    return int(subprocess.run(q, capture_output=True, text=True, check=True).stdout.strip())


def run_one(name: str, lib: str | None, limit: str, tmp: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD"))}
    if lib:
        env.update(LD_PRELOAD=os.path.abspath(lib), CUDA_DEVICE_MEMORY_LIMIT=limit, LIBCUDA_LOG_LEVEL="2",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=os.path.join(tmp, f"{name}.cache"))  # fmt: skip
    base = used_mib()
    p = subprocess.Popen([sys.executable, __file__, "--child", name], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    step_mib = None
    line = p.stdout.readline()
    if line.startswith("STEP"):
        step_mib = used_mib() - base
        p.stdin.write("\n")
        p.stdin.flush()
        line = p.stdout.readline()
    held_mib = used_mib() - base  # the child holds everything it got until told to exit
    p.stdin.write("\n")
    p.stdin.flush()
    rest, err = p.communicate(timeout=120)
    res = json.loads(line) if line.startswith("{") else {"scenario": name, "error": line + rest}
    res.update(mode="libvgpu " + limit if lib else "no libvgpu", held_mib_with_context=held_mib)
    if step_mib is not None:
        res["physical_after_set_mib"] = step_mib
    res["stderr"] = [ln for ln in err.splitlines() if "libvgpu" in ln][-4:]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="libvgpu.so to preload (the 'after' runs)")
    ap.add_argument("--limit", default="2g")
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--out")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        res = scenario(a.child)
        print(json.dumps(res), flush=True)
        sys.stdin.readline()  # hold until the parent has read the card
        return
    tmp = tempfile.mkdtemp(prefix="vgpu-escapes-")
    lines = []
    for name in a.only.split(","):
        for lib in [None, a.lib] if a.lib else [None]:
            t0 = time.monotonic()
            r = run_one(name, lib, a.limit, tmp)
            r["wall_s"] = round(time.monotonic() - t0, 2)
            lines.append(r)
            print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in lines)


if __name__ == "__main__":
    main()

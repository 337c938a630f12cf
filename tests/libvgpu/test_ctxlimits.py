"""cuCtxSetLimit: the device malloc heap, the printf FIFO, the per-thread stack (value x
multiprocessors x resident threads) and the device runtime's reservations are charged before
the driver reserves them, refused with CUDA_ERROR_OUT_OF_MEMORY when they do not fit, follow the
limit down, and go with the context. Before, a 6 GiB heap was held under a 2 GiB limit.
"""

from __future__ import annotations

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB

GIB = 1024 * MIB
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "2g", "FAKE_GPU_MIB": "16384"}  # fake: 4 SMs x 2048 threads


def free_bytes(line: list[str]) -> int:
    assert line[0] == "meminfo" and line[1] == "0", line
    return int(line[2])


@pytest.mark.parametrize(("which", "value", "default"), [("heap", "6g", 8 * MIB), ("printf", "3g", MIB),
                                                         ("stack", "512k", 1024)])  # fmt: skip
def test_limit_over_the_memory_limit_is_refused_before_the_driver(cli, which, value, default):
    # the stack: 512 KiB x 4 SMs x 2048 threads = 4 GiB
    r = cli.run("init", "setlimit", which, value, "calls", "cuCtxSetLimit", "meminfo", env=LIMIT)
    assert r.op(1) == ["setlimit", str(CUDA_ERROR_OUT_OF_MEMORY), str(default)]  # the value is unchanged
    assert r.op(2) == ["calls", "0", "0"]
    assert free_bytes(r.op(3)) == 2 * GIB


def test_heap_is_charged_above_its_default_and_follows_the_limit_down(cli):
    r = cli.run("init", "setlimit", "heap", "1g", "meminfo", "setlimit", "heap", "520m", "meminfo",
                "setlimit", "heap", "8m", "meminfo", "setlimit", "heap", "1g", "alloc", "1033m", "alloc", "1032m",
                env=LIMIT)  # fmt: skip
    assert r.codes("setlimit") == [CUDA_SUCCESS] * 4
    assert free_bytes(r.op(2)) == 2 * GIB - (1024 - 8) * MIB
    assert free_bytes(r.op(4)) == 2 * GIB - 512 * MIB
    assert free_bytes(r.op(6)) == 2 * GIB
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]  # the heap holds 1016 MiB of 2 GiB


def test_stack_is_charged_for_every_resident_thread(cli):
    r = cli.run("init", "setlimit", "stack", "64k", "meminfo", env=LIMIT)
    assert r.op(1) == ["setlimit", "0", str(64 * 1024)]
    assert free_bytes(r.op(2)) == 2 * GIB - (64 - 1) * 1024 * 4 * 2048


def test_device_runtime_reservation_is_measured_and_set_back_when_over(cli):
    # the fake driver reserves 1 KiB per pending launch above 2048: 4 Mi launches = ~4 GiB
    r = cli.run("init", "setlimit", "pending", "4194304", "meminfo", "setlimit", "pending", "526336", "meminfo",
                env=LIMIT)  # fmt: skip
    assert r.op(1) == ["setlimit", str(CUDA_ERROR_OUT_OF_MEMORY), "2048"]
    assert free_bytes(r.op(2)) == 2 * GIB
    assert r.op(3) == ["setlimit", "0", "526336"]
    assert free_bytes(r.op(4)) == 2 * GIB - 512 * MIB


def test_destroyed_context_gives_its_limits_back(cli):
    r = cli.run("init", "ctxcreate", "0", "2", "setlimit", "heap", "1g", "ctx", "0", "meminfo",
                "free", "0", "meminfo", env=LIMIT)  # fmt: skip
    assert r.codes("setlimit") == [CUDA_SUCCESS]
    assert free_bytes(r.op(4)) == 2 * GIB - (1024 - 8) * MIB
    assert free_bytes(r.op(6)) == 2 * GIB


def test_cuctxsetlimit_is_reached_through_each_door(cli):
    r = cli.run("dlsym", "cuCtxSetLimit", "procaddr", "cuCtxSetLimit", "12000", "0")
    assert r.op(0) == ["dlsym", "libvgpu.so:cuCtxSetLimit"]
    assert r.op(1) == ["procaddr", "0", "0", "libvgpu.so:cuCtxSetLimit"]

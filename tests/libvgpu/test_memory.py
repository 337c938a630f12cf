"""Memory limits on one process: every allocation API stops exactly at the limit with
CUDA_ERROR_OUT_OF_MEMORY and no call reaching the driver, frees give the bytes back, and the
memory queries (CUDA v1/v2, NVML v1/v2) report the limit as the card's size.
"""

from __future__ import annotations

import pytest

from .conftest import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    MIB,
)
from .test_config_file import config
from .test_multiproc import wait_line

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_GPU_MIB": "1024"}

# op name, arguments that take exactly 64 MiB, arguments for one more byte / element,
# and the fake driver's function that must not be called for the refused request.
APIS = [
    ("alloc", ["64m"], ["1"], "cuMemAlloc_v2"),
    ("alloc1", ["64m"], ["1"], "cuMemAlloc"),
    ("managed", ["64m"], ["1"], "cuMemAllocManaged"),
    ("async", ["64m"], ["1"], "cuMemAllocAsync"),
    ("async_ptsz", ["64m"], ["1"], "cuMemAllocAsync_ptsz"),
    ("pool", ["64m"], ["1"], "cuMemAllocFromPoolAsync"),
    ("pool_ptsz", ["64m"], ["1"], "cuMemAllocFromPoolAsync_ptsz"),
    ("pitch", ["1024", "65536"], ["1", "1"], "cuMemAllocPitch_v2"),  # 1024 B rows x 64 Ki rows
    ("array", ["4096", "4096"], ["1", "1"], "cuArrayCreate_v2"),  # float32, 1 channel
    ("array3d", ["1024", "1024", "16"], ["1", "1", "1"], "cuArray3DCreate_v2"),
    ("vmm", ["0", "64m"], ["0", "1"], "cuMemCreate"),
    # the v1 ABI (32-bit sizes and descriptors)
    ("pitch1", ["1024", "65536"], ["1", "1"], "cuMemAllocPitch"),
    ("array1", ["4096", "4096"], ["1", "1"], "cuArrayCreate"),
    ("array3d1", ["1024", "1024", "16"], ["1", "1", "1"], "cuArray3DCreate"),
]


@pytest.mark.parametrize(("op", "fill", "extra", "fn"), APIS, ids=[a[0] for a in APIS])
def test_exactly_at_limit_then_oom_without_driver_call(cli, op, fill, extra, fn):
    r = cli.run("init", op, *fill, op, *extra, "calls", fn, "meminfo", env=LIMIT)
    assert r.codes(op) == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(3) == ["calls", "0", "1"]  # the refused request never reached the driver
    assert r.op(4) == ["meminfo", "0", "0", str(64 * MIB)]


@pytest.mark.parametrize(("op", "fill", "extra", "fn"), APIS, ids=[a[0] for a in APIS])
def test_free_gives_bytes_back(cli, op, fill, extra, fn):
    # "sync": stream-ordered pools give their memory back at a synchronisation (test_pools.py)
    r = cli.run("init", op, *fill, "free", "0", op, *fill, "free", "1", "sync", "meminfo", env=LIMIT)
    assert r.codes(op) == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert r.codes("free") == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert r.op(6) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]


def test_pitch_is_charged_at_the_driver_pitch(cli):
    # 1000-byte rows padded by the driver to 1024: 65536 rows take exactly 64 MiB.
    r = cli.run("init", "pitch", "1000", "65536", "alloc", "1", env=LIMIT)
    assert r.op(1) == ["pitch", "0", "0", "1024"]
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_pitch_larger_than_estimate_is_undone(cli):
    # The driver pads rows to 4096 B while the estimate assumed 512: 16384 rows need 64 MiB,
    # 16385 rows need more, so the allocation is freed again and OOM returned.
    env = {**LIMIT, "FAKE_PITCH_ALIGN": "4096"}
    r = cli.run("init", "pitch", "100", "16385", "meminfo", "pitch", "100", "16384", env=env)
    assert r.codes("pitch") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert r.op(2) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]


def test_mipmapped_array_counts_every_level(cli):
    # 2048x2048 float + 1024x1024 + 512x512 = 16 + 4 + 1 MiB = 21 MiB
    r = cli.run("init", "mipmap", "2048", "2048", "3", "meminfo", "free", "0", "meminfo", env=LIMIT)
    assert r.codes("mipmap") == [CUDA_SUCCESS]
    assert r.op(2) == ["meminfo", "0", str(43 * MIB), str(64 * MIB)]
    assert r.op(4) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]


def test_host_located_vmm_is_not_charged(cli):
    r = cli.run("init", "vmmhost", "0", "512m", "alloc", "64m", env=LIMIT)
    assert r.codes("vmmhost") == [CUDA_SUCCESS]
    assert r.codes("alloc") == [CUDA_SUCCESS]


def test_many_small_allocations_sum_exactly(cli):
    ops = ["init"] + ["alloc", "4m"] * 16 + ["alloc", "1"]
    r = cli.run(*ops, env=LIMIT)
    assert r.codes("alloc") == [CUDA_SUCCESS] * 16 + [CUDA_ERROR_OUT_OF_MEMORY]


def test_unknown_and_double_free_do_not_change_usage(cli):
    r = cli.run("init", "alloc", "32m", "free", "0", "free", "0", "freeptr", "0x1234", "meminfo", env=LIMIT)
    assert r.codes("free") == [CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE]
    assert r.codes("freeptr") == [CUDA_ERROR_INVALID_VALUE]  # passed to the driver, which says why
    assert r.op(5) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]


def test_physical_oom_is_the_drivers_answer_and_leaves_no_charge(cli):
    # limit above the card: the driver's own OOM comes back and nothing stays charged
    r = cli.run(
        "init", "alloc", "1536m", "meminfo", env={"CUDA_DEVICE_MEMORY_LIMIT": "2g", "FAKE_GPU_MIB": "1024"}
    )
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(2) == ["meminfo", "0", str(1024 * MIB), str(1024 * MIB)]


def test_calls_before_cuinit_do_not_crash(cli):
    r = cli.run("alloc", "1m", "meminfo", "procaddr", "cuMemAlloc", "12000", "0", env=LIMIT)
    assert r.returncode == 0
    assert r.codes("alloc") == [CUDA_ERROR_NOT_INITIALIZED]
    assert r.codes("meminfo") == [CUDA_ERROR_NOT_INITIALIZED]
    assert r.op(2) == ["procaddr", "0", "0", "libvgpu.so:cuMemAlloc_v2"]


class TestReportedSizes:
    def test_limit_below_physical(self, cli):
        r = cli.run(
            "init", "alloc", "24m", "meminfo", "meminfo1", "totalmem", "0", "totalmem1", "0",
            "nvmlmem", "0", "nvmlmem2", "0", env=LIMIT,
        )  # fmt: skip
        assert r.op(2) == ["meminfo", "0", str(40 * MIB), str(64 * MIB)]
        assert r.op(3) == ["meminfo1", "0", str(40 * MIB), str(64 * MIB)]
        assert r.op(4) == ["totalmem", "0", str(64 * MIB)]
        assert r.op(5) == ["totalmem1", "0", str(64 * MIB)]
        assert r.op(6) == ["nvmlmem", "0", str(64 * MIB), str(24 * MIB), str(40 * MIB)]
        assert r.op(7) == ["nvmlmem2", "0", str(64 * MIB), str(24 * MIB), str(40 * MIB), "0"]

    def test_limit_above_physical_reports_physical(self, cli):
        r = cli.run("init", "meminfo", "totalmem", "0", env={"CUDA_DEVICE_MEMORY_LIMIT": "4g"})
        assert r.op(1) == ["meminfo", "0", str(1024 * MIB), str(1024 * MIB)]
        assert r.op(2) == ["totalmem", "0", str(1024 * MIB)]

    def test_no_limit_passes_the_driver_through(self, cli):
        r = cli.run("init", "alloc", "100m", "meminfo", "totalmem", "0", "nvmlmem2", "0")
        assert r.op(2) == ["meminfo", "0", str(924 * MIB), str(1024 * MIB)]
        assert r.op(3) == ["totalmem", "0", str(1024 * MIB)]
        # fake NVML's own numbers, with its 5 MiB reserved
        assert r.op(4) == ["nvmlmem2", "0", str(1024 * MIB), str(100 * MIB), str(919 * MIB), str(5 * MIB)]

    def test_nvml_only_process_sees_the_limit(self, cli):
        r = cli.run("nvmlmem", "0", env=LIMIT)
        assert r.op(0) == ["nvmlmem", "0", str(64 * MIB), "0", str(64 * MIB)]


class TestContextCharge:
    """The primary context's memory counts against the limit, apart from allocations."""

    CTX = {**LIMIT, "CUDA_DEVICE_MEMORY_LIMIT": "1g", "FAKE_CTX_MIB": "300"}

    def test_measured_from_device_growth(self, cli):
        r = cli.run("init", "meminfo", "alloc", "724m", "alloc", "1", env=self.CTX)
        assert r.op(1) == ["meminfo", "0", str(724 * MIB), str(1024 * MIB)]
        assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]

    def test_measured_from_own_nvml_entry_despite_neighbours(self, cli):
        r = cli.run("init", "meminfo", env={**self.CTX, "FAKE_NVML_SELF": "1", "FAKE_NVML_PROCS": "2"})
        assert r.op(1) == ["meminfo", "0", str(724 * MIB), str(1024 * MIB)]

    def test_given_back_at_last_release_and_reset(self, cli):
        r = cli.run(
            "init", "ctx", "0", "ctxrelease", "0", "meminfo", "ctxrelease", "0", "meminfo",
            "ctx", "0", "meminfo", "ctxreset", "0", "meminfo", env=self.CTX,
        )  # fmt: skip
        charged, free = (
            ["meminfo", "0", str(724 * MIB), str(1024 * MIB)],
            ["meminfo", "0", str(1024 * MIB), str(1024 * MIB)],
        )
        assert r.op(3) == charged  # one of two references released: still charged
        assert r.op(5) == free  # last reference released
        assert r.op(7) == charged  # re-created
        assert r.op(9) == free  # reset

    def test_usage_above_the_limit_reads_zero_free_not_an_error(self, cli):
        # A context that does not fit is refused now (test_tenant_doors.py); usage still passes a
        # process's own limit when its environment lowers it below what its siblings hold.
        cli.install(cli.tmp / "vgpu", config(cli.cache, limit="200m"))
        holder = cli.popen("init", "alloc", "150m", "hold", env={"FAKE_GPU_MIB": "1024"})
        try:
            wait_line(holder, "hold")
            r = cli.run("init", "meminfo", "nvmlmem", "0", "alloc", "1",
                        env={"FAKE_GPU_MIB": "1024", "CUDA_DEVICE_MEMORY_LIMIT": "100m"})  # fmt: skip
        finally:
            holder.kill()
            holder.wait()
        assert r.op(1) == ["meminfo", "0", "0", str(100 * MIB)]  # core#200, HAMi#1370
        assert r.op(2) == ["nvmlmem", "0", str(100 * MIB), str(150 * MIB), "0"]
        assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]

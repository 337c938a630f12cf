"""Context and module memory: contexts made with cuCtxCreate* and module images
(cuModuleLoad*, cuLibraryLoad*) are measured, counted against the limit and reported apart
from allocations (region slots' context[] and module[]), and given back on destroy/unload or
when their context goes. IPC and pool-pointer imports are charged to the importer until it
closes or frees them.
"""

from __future__ import annotations

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB
from .region import read_region
from .test_multiproc import wait_line

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "256m", "FAKE_GPU_MIB": "1024"}
CTX = {**LIMIT, "FAKE_CTX_MIB": "40"}


def meminfo(free_mib: int, total_mib: int = 256) -> list[str]:
    return ["meminfo", "0", str(free_mib * MIB), str(total_mib * MIB)]


LOADERS = [
    ("file", "cuModuleLoad", "cuModuleUnload"),
    ("data", "cuModuleLoadData", "cuModuleUnload"),
    ("dataex", "cuModuleLoadDataEx", "cuModuleUnload"),
    ("fatbin", "cuModuleLoadFatBinary", "cuModuleUnload"),
    ("lib", "cuLibraryLoadData", "cuLibraryUnload"),
    ("libfile", "cuLibraryLoadFromFile", "cuLibraryUnload"),
]


class TestModules:
    @pytest.mark.parametrize(("how", "load_fn", "unload_fn"), LOADERS, ids=[x[0] for x in LOADERS])
    def test_load_is_charged_and_unload_gives_it_back(self, cli, how, load_fn, unload_fn):
        r = cli.run(
            "init", "modload", how, "30m", "meminfo", "free", "0", "meminfo", "calls", load_fn,
            "calls", unload_fn, env=LIMIT,
        )  # fmt: skip
        assert r.codes("modload") == [CUDA_SUCCESS]
        assert r.op(2) == meminfo(226)
        assert r.codes("free") == [CUDA_SUCCESS]
        assert r.op(4) == meminfo(256)
        assert r.op(5) == ["calls", "0", "1"]
        assert r.op(6) == ["calls", "0", "1"]

    @pytest.mark.parametrize(("how", "load_fn", "unload_fn"), LOADERS, ids=[x[0] for x in LOADERS])
    def test_module_over_the_limit_is_unloaded_and_oom_returned(self, cli, how, load_fn, unload_fn):
        r = cli.run(
            "init", "alloc", "200m", "modload", how, "57m", "calls", unload_fn, "meminfo",
            "modload", how, "56m", "meminfo", env=LIMIT,
        )  # fmt: skip
        assert r.codes("modload") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
        assert r.op(3) == ["calls", "0", "1"]  # the load that did not fit was undone
        assert r.op(4) == meminfo(56)
        assert r.op(6) == meminfo(0)  # exactly at the limit
        assert "module needs 59768832 bytes" in r.stderr

    def test_module_charge_blocks_allocations(self, cli):
        r = cli.run("init", "modload", "data", "100m", "alloc", "157m", "alloc", "156m", env=LIMIT)
        assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]

    def test_a_large_module_is_charged_in_full(self, cli):
        # huge static __device__ data: the whole growth is charged (it was capped at 256 MiB,
        # so a 300 MiB module fitted a 256 MiB limit exactly)
        env = {**LIMIT, "CUDA_DEVICE_MEMORY_LIMIT": "1g"}
        r = cli.run("init", "modload", "data", "300m", "nvmlmem", "0", env=env)
        assert r.op(2) == ["nvmlmem", "0", str(1024 * MIB), str(300 * MIB), str(724 * MIB)]

    def test_a_module_over_the_limit_is_refused(self, cli):
        r = cli.run("init", "modload", "data", "300m", "meminfo", "calls", "cuModuleUnload", env=LIMIT)
        assert r.codes("modload") == [CUDA_ERROR_OUT_OF_MEMORY]
        assert r.op(2) == meminfo(256)
        assert r.op(3) == ["calls", "0", "1"]  # loaded by the driver, unloaded again before the caller saw it

    def test_empty_module_charges_nothing(self, cli):
        r = cli.run("init", "modload", "data", "0", "meminfo", "free", "0", "meminfo", env=LIMIT)
        assert r.codes("modload") == [CUDA_SUCCESS]
        assert r.op(2) == meminfo(256)
        assert r.op(4) == meminfo(256)

    def test_modules_go_with_their_created_context(self, cli):
        r = cli.run(
            "init", "ctxcreate", "0", "4", "modload", "data", "30m", "modload", "lib", "10m", "meminfo",
            "free", "0", "ctx", "0", "meminfo", "free", "2", "meminfo", "calls", "cuLibraryUnload", env=CTX,
        )  # fmt: skip
        # primary 40 + created 40 + modules 40 charged
        assert r.op(4) == meminfo(256 - 120)
        assert r.codes("free")[0] == CUDA_SUCCESS
        assert r.op(7) == meminfo(256 - 40)  # context and both modules given back
        assert r.op(9) == meminfo(256 - 40)  # a later unload gives nothing back twice
        assert r.op(10) == ["calls", "0", "1"]  # and still reaches the driver

    def test_modules_go_with_the_primary_context_reset(self, cli):
        r = cli.run(
            "init", "modload", "data", "30m", "meminfo", "ctxreset", "0", "ctx", "0", "meminfo", env=CTX
        )
        assert r.op(2) == meminfo(256 - 70)
        assert r.op(5) == meminfo(256 - 40)  # new primary context; the old one's module is gone

    def test_module_without_a_context_is_not_measured(self, cli):
        r = cli.run("cuinit", "modload", "data", "10m", env=LIMIT)
        assert r.op(1)[:2] == ["modload", "201"]  # the driver's CUDA_ERROR_INVALID_CONTEXT

    def test_disabled_control_does_not_charge(self, cli):
        r = cli.run(
            "init", "modload", "data", "300m", "meminfo", env={**LIMIT, "CUDA_DISABLE_CONTROL": "true"}
        )
        assert r.codes("modload") == [CUDA_SUCCESS]
        assert r.op(2) == ["meminfo", "0", str(724 * MIB), str(1024 * MIB)]


class TestCreatedContexts:
    @pytest.mark.parametrize("version", ["1", "2", "3", "4"])
    def test_every_cuctxcreate_version_is_charged_and_destroy_gives_back(self, cli, version):
        r = cli.run(
            "init", "ctxcreate", "0", version, "meminfo", "ctxdestroy1", "0", "ctx", "0", "meminfo",
            "calls", f"cuCtxCreate{'' if version == '1' else '_v' + version}", env=CTX,
        )  # fmt: skip
        assert r.codes("ctxcreate") == [CUDA_SUCCESS]
        assert r.op(2) == meminfo(256 - 80)
        assert r.codes("ctxdestroy1") == [CUDA_SUCCESS]
        assert r.op(5) == meminfo(256 - 40)
        assert r.op(6) == ["calls", "0", "1"]

    def test_destroy_v2_and_allocations_held_before_are_not_charged_twice(self, cli):
        r = cli.run(
            "init", "alloc", "100m", "ctxcreate", "0", "2", "meminfo", "free", "1", "ctx", "0", "meminfo",
            env=CTX,
        )  # fmt: skip
        assert r.op(3) == meminfo(256 - 180)
        assert r.op(6) == meminfo(256 - 140)

    def test_measured_from_own_nvml_entry_despite_neighbours(self, cli):
        env = {**CTX, "FAKE_NVML_SELF": "1", "FAKE_NVML_PROCS": "3"}
        r = cli.run("init", "alloc", "16m", "ctxcreate", "0", "3", "ctxcreate", "0", "1", "meminfo", env=env)
        assert r.op(4) == meminfo(256 - 16 - 3 * 40)

    def test_context_over_the_limit_is_destroyed_and_oom_returned(self, cli):
        env = {**CTX, "CUDA_DEVICE_MEMORY_LIMIT": "64m"}
        r = cli.run("init", "ctxcreate", "0", "4", "ctx", "0", "meminfo", "alloc", "24m", "calls", "cuCtxDestroy_v2",
                    env=env)  # fmt: skip
        assert r.codes("ctxcreate") == [CUDA_ERROR_OUT_OF_MEMORY]  # primary 40 + 40 > 64
        assert r.op(3) == meminfo(24, 64)
        assert r.codes("alloc") == [CUDA_SUCCESS]
        assert r.op(5) == ["calls", "0", "1"]


def test_region_reports_context_and_module_apart(cli):
    holder = cli.popen(
        "init", "alloc", "10m", "ctxcreate", "0", "4", "modload", "data", "6m", "hold", env=CTX
    )
    wait_line(holder, "hold")
    region = read_region(cli.cache)
    holder.kill()
    holder.wait()
    assert (region.major, region.minor) == (2, 2)
    (mine,) = [s for s in region.slots if s.pid == holder.pid]
    counters = (mine.used[0], mine.data[0], mine.context[0], mine.module[0])
    assert counters == (96 * MIB, 10 * MIB, 80 * MIB, 6 * MIB)


def test_ipc_import_is_charged_to_the_importer_until_closed(cli):
    # the exporter's free does not end the charge: the import keeps the memory mapped
    r = cli.run(
        "init", "alloc", "16m", "ipcopen", "0", "meminfo", "free", "0", "meminfo", "free", "1", "meminfo",
        env=LIMIT,
    )  # fmt: skip
    assert r.codes("ipcopen") == [CUDA_SUCCESS]
    assert r.op(3) == meminfo(224)  # exporter and importer: counted twice while both hold it
    assert r.op(5) == meminfo(240)  # exported buffer freed, the import still maps it
    assert r.codes("free") == [CUDA_SUCCESS, CUDA_SUCCESS]  # cuIpcCloseMemHandle
    assert r.op(7) == meminfo(256)


def test_ipc_import_over_the_limit_is_closed_again(cli):
    r = cli.run("init", "alloc", "200m", "ipcopen", "0", "calls", "cuIpcCloseMemHandle", "meminfo", env=LIMIT)
    assert r.codes("ipcopen") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(3) == ["calls", "0", "1"]
    assert r.op(4) == meminfo(56)


def test_pool_pointer_import_is_charged_until_freed(cli):
    r = cli.run("init", "async", "100m", "poolimport", "0", "meminfo", "free", "1", "meminfo",
                "poolimport", "0", "poolimport", "0", env=LIMIT)  # fmt: skip
    assert r.codes("poolimport") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(3) == meminfo(56)
    assert r.op(5) == meminfo(156)


@pytest.mark.parametrize(
    ("sym", "ver", "want"),
    [
        ("cuCtxCreate", "3020", "libvgpu.so:cuCtxCreate_v2"),
        ("cuCtxCreate", "12050", "libvgpu.so:cuCtxCreate_v4"),
        ("cuCtxCreate", "2000", "libvgpu.so:cuCtxCreate"),
        ("cuCtxDestroy", "4000", "libvgpu.so:cuCtxDestroy_v2"),
        ("cuModuleLoadData", "12000", "libvgpu.so:cuModuleLoadData"),
        ("cuLibraryLoadData", "12000", "libvgpu.so:cuLibraryLoadData"),
        ("cuLibraryUnload", "12000", "libvgpu.so:cuLibraryUnload"),
        ("cuIpcOpenMemHandle", "11000", "libvgpu.so:cuIpcOpenMemHandle_v2"),
        ("cuIpcOpenMemHandle", "4010", "libvgpu.so:cuIpcOpenMemHandle"),
        ("cuIpcCloseMemHandle", "12000", "libvgpu.so:cuIpcCloseMemHandle"),
        ("cuMemPoolImportPointer", "12000", "libvgpu.so:cuMemPoolImportPointer"),
        ("cuIpcOpenMemHandle", "12000", "libvgpu.so:cuIpcOpenMemHandle_v2"),
    ],
)
def test_new_hooks_through_cugetprocaddress(cli, sym, ver, want):
    r = cli.run("procaddr", sym, ver, "0")
    assert r.op(0) == ["procaddr", "0", "0", want]


def test_new_hooks_through_dlsym(cli):
    r = cli.run("dlsym", "cuModuleLoad", "dlsym", "cuCtxCreate_v3", "dlsym", "cuIpcCloseMemHandle")
    assert [f[1] for f in r.lines] == [
        "libvgpu.so:cuModuleLoad",
        "libvgpu.so:cuCtxCreate_v3",
        "libvgpu.so:cuIpcCloseMemHandle",
    ]


def test_cuctxcreate_before_cuinit_gets_the_drivers_answer_and_registers_nothing(cli):
    r = cli.run("ctxcreate", "0", "4", env=CTX)
    assert r.op(0) == ["ctxcreate", "3", "-1"]  # CUDA_ERROR_NOT_INITIALIZED
    assert not cli.cache.exists() or read_region(cli.cache).device_count == 0


class TestLazyLoading:
    """CUDA_MODULE_LOADING=LAZY: the load takes nothing, the fake driver takes the module's bytes
    at the first function handle; libvgpu charges them then, with the limit check."""

    LAZY = {**LIMIT, "CUDA_MODULE_LOADING": "LAZY"}

    @pytest.mark.parametrize("how", ["data", "lib"])
    def test_memory_is_charged_when_it_materialises(self, cli, how):
        r = cli.run(
            "init", "modload", how, "40m", "meminfo", "getfunc", "0", "meminfo", "getfunc", "0", "meminfo",
            "free", "0", "meminfo", env=self.LAZY,
        )  # fmt: skip
        assert r.codes("modload") == [CUDA_SUCCESS]
        assert r.op(2) == meminfo(256)  # nothing loaded yet
        assert r.codes("getfunc") == [CUDA_SUCCESS, CUDA_SUCCESS]
        assert r.op(4) == meminfo(216)  # the kernels' 40 MiB, charged once
        assert r.op(6) == meminfo(216)
        assert r.op(8) == meminfo(256)  # given back with the module

    def test_materialising_past_the_limit_is_refused(self, cli):
        r = cli.run(
            "init", "alloc", "230m", "modload", "data", "40m", "getfunc", "1", "alloc", "26m", "alloc", "1",
            env=self.LAZY,
        )  # fmt: skip
        assert r.codes("getfunc") == [CUDA_ERROR_OUT_OF_MEMORY]
        assert "kernels need 41943040 bytes" in r.stderr
        # the refused kernels' memory stays with the driver (the module is still loaded) but is not
        # charged: the container's own allocations keep the rest of the limit
        assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_imported_external_memory_is_charged_to_the_importer(cli):
    r = cli.run(
        "init", "extmem", "100m", "meminfo", "extmem", "157m", "alloc", "156m", "alloc", "1", "free", "0",
        "meminfo", env=LIMIT,
    )  # fmt: skip
    assert r.codes("extmem") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(2) == meminfo(156)
    assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.codes("free") == [CUDA_SUCCESS]  # cuDestroyExternalMemory gives the 100 MiB back
    assert r.op(7) == meminfo(100)

"""A hostile tenant's doors around the hooks, opened with the C library alone (docs/security.md,
"A tenant process"): the C library's own dlsym/dlvsym fetched by a versioned lookup or from a second
C library in a new namespace, a renamed copy of libcuda.so.1, libcuda.so.1 in a new namespace, and
an exit handler that outlives libvgpu's. Each must leave the tenant at its limit: the attack
program (libvgpu/tests/t_attack.c) prints 0 where a door lets an allocation past it.
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
import sys

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB, parse
from .region import read_region
from .test_config_file import config
from .test_multiproc import wait_line

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_GPU_MIB": "1024"}


def _libc_versions() -> list[str]:
    """The versions this machine's C library gives dlsym/dlvsym: the architecture's first one, and
    GLIBC_2.34 (where they moved into libc.so.6) from glibc 2.34 on."""
    first = "GLIBC_2.17" if platform.machine() == "aarch64" else "GLIBC_2.2.5"
    major, minor = (int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    return [first] + (["GLIBC_2.34"] if (major, minor) >= (2, 34) else [])


LIBC_VERSIONS = _libc_versions()


def attack(cli, *ops: str, env: dict[str, str] | None = None, popen: bool = False):
    p = subprocess.Popen(
        [str(cli.build / "tests" / "t_attack"), *ops], env=cli.env({**LIMIT, **(env or {})}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    if popen:
        return p
    out, err = p.communicate(timeout=20)
    return parse(p.returncode, out, err)


def test_the_front_door_holds_the_limit(cli):
    r = attack(cli, "init", "alloc", "100m", "alloc", "64m")
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]


@pytest.mark.parametrize("version", LIBC_VERSIONS)
def test_the_c_librarys_dlsym_by_version_gets_the_hook(cli, version):
    r = attack(cli, "init", "libc_dlsym", version, "100m")
    assert r.codes("libc_dlsym") == [CUDA_ERROR_OUT_OF_MEMORY]


@pytest.mark.parametrize("version", LIBC_VERSIONS)
def test_the_c_librarys_dlvsym_by_version_gets_the_hook(cli, version):
    r = attack(cli, "init", "libc_dlvsym", version, "100m")
    assert r.codes("libc_dlvsym") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_dlsym_of_a_second_c_library_gets_the_hook(cli):
    r = attack(cli, "init", "nslibc_dlsym", "100m")
    assert r.codes("nslibc_dlsym") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_a_renamed_copy_of_the_driver_is_not_a_way_around(cli):
    copy = cli.tmp / "libnotcuda.so"
    shutil.copy(cli.build / "fake" / "libcuda.so.1", copy)
    r = attack(cli, "copy", str(copy), "100m", "alloc", "1")
    # the copy's entry points are the hooks: the allocation is refused (or finds no context of the
    # copy's), never granted past the limit
    assert r.codes("copy") != [CUDA_SUCCESS]
    assert "libnotcuda.so" not in r.stderr or "ERROR" not in r.stderr


def test_the_driver_in_a_new_namespace_is_not_a_way_around(cli):
    r = attack(cli, "ns", "100m")
    assert r.codes("ns") != [CUDA_SUCCESS]


def test_memory_of_a_process_in_its_exit_path_stays_charged(cli):
    """An exit handler registered before the first CUDA call runs after libvgpu's: the process is
    alive, holding its memory, after libvgpu's handler ran. A sibling must still see that memory."""
    holder = attack(cli, "exit_hold", "init", "alloc", "60m", "exit", popen=True)
    try:
        wait_line(holder, "held")
        r = attack(cli, "init", "alloc", "60m", "alloc", "4m")
    finally:
        holder.kill()
        holder.wait()
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]


class TestContextsCountAgainstTheLimit:
    """A context is device memory (about 500 MiB on an H200): charged without a limit check, a
    tenant that made contexts in a loop - or started processes - held the card's memory past its
    limit, taking it from the card's other containers."""

    CTX = {"CUDA_DEVICE_MEMORY_LIMIT": "100m", "FAKE_GPU_MIB": "1024", "FAKE_CTX_MIB": "30"}

    def test_created_contexts_stop_at_the_limit(self, cli):
        r = cli.run("init", *["ctxcreate", "0", "2"] * 4, "ctx", "0", "meminfo", "calls", "cuCtxDestroy_v2",
                    env=self.CTX)  # fmt: skip
        # primary 30 + two created 30 each = 90 MiB; the third created one does not fit
        assert r.codes("ctxcreate") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY,
                                        CUDA_ERROR_OUT_OF_MEMORY]  # fmt: skip
        assert r.lines[-2] == ["meminfo", "0", str(10 * MIB), str(100 * MIB)]
        assert r.lines[-1] == ["calls", "0", "2"]  # the two that did not fit were destroyed again
        assert "cuCtxCreate_v2: out of memory on device 0" in r.stderr

    def test_a_process_whose_primary_context_does_not_fit_is_refused(self, cli):
        holders = [cli.popen("init", "hold", env=self.CTX) for _ in range(3)]
        try:
            for h in holders:
                wait_line(h, "hold")
            r = cli.run("init", "meminfo", env=self.CTX)
        finally:
            for h in holders:
                h.kill()
                h.wait()
        assert r.codes("init") == [CUDA_ERROR_OUT_OF_MEMORY]  # 3 x 30 MiB held: a fourth does not fit
        assert "cuDevicePrimaryCtxRetain: out of memory on device 0" in r.stderr

    def test_a_refused_primary_context_is_not_charged(self, cli):
        r = cli.run("init", "alloc", "70m", "ctxrelease", "0", "alloc", "20m", "ctx", "0", "free", "1", "ctx", "0",
                    "meminfo", env=self.CTX)  # fmt: skip
        assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_SUCCESS]
        assert r.codes("ctx") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]  # 70 + 20 + 30 > 100; 70 + 30 fits
        assert r.lines[-1] == ["meminfo", "0", "0", str(100 * MIB)]


class TestManyPools:
    """Every stream-ordered pool is modelled (what it keeps after frees stays charged): a tenant that
    made more pools than the model's table used to get per-allocation charging for the extra ones,
    so each of them could keep the limit's worth of freed blocks uncharged."""

    def test_the_65th_pool_keeps_its_freed_blocks_charged(self, cli):
        pools = ["poolcreate"] * 65
        thresholds = [arg for i in range(65) for arg in ("threshold", str(i), str(2**64 - 1))]
        r = cli.run("init", *pools, *thresholds, "poolalloc", "64", "60m", "free", "65", "alloc", "60m",
                    "meminfo", env=LIMIT)  # fmt: skip
        assert r.codes("poolcreate") == [CUDA_SUCCESS] * 65
        assert r.codes("poolalloc") == [CUDA_SUCCESS]
        assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]  # the pool still holds 60 of the 64 MiB
        assert r.lines[-1] == ["meminfo", "0", str(4 * MIB), str(64 * MIB)]

    def test_beyond_the_table_an_allocation_is_refused(self, cli):
        n = 1025
        thresholds = [arg for i in range(n) for arg in ("threshold", str(i), "0")]
        r = cli.run("init", *["poolcreate"] * n, *thresholds, "poolalloc", str(n - 1), "1m", "poolalloc", "0", "1m",
                    env=LIMIT, timeout=60)  # fmt: skip
        assert r.codes("poolalloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
        assert "more than 1024 memory pools in use" in r.stderr

    def test_a_destroyed_pool_gives_its_entry_back(self, cli):
        n = 1100
        ops = [arg for i in range(n) for arg in ("poolcreate", "threshold", str(i), "0", "free", str(i))]
        r = cli.run("init", *ops, "poolcreate", "poolalloc", str(n), "1m", env=LIMIT, timeout=60)
        assert r.codes("poolalloc") == [CUDA_SUCCESS]


class TestAnUnusableRegionFailsClosed:
    """The region file is in the container's writable directory. Where the config file names it,
    making it unusable (garbage, a FIFO or a directory in its place, no permission) used to give
    every process a private region - the whole limit each."""

    @staticmethod
    def _break(cli, how: str) -> None:
        cli.cache.unlink(missing_ok=True)
        if how == "garbage":
            cli.cache.write_bytes(b"not a region" * 100)
        elif how == "fifo":
            os.mkfifo(cli.cache)
        else:
            cli.cache.mkdir()

    @pytest.mark.parametrize("how", ["garbage", "fifo", "directory"])
    def test_with_the_config_file_no_process_gets_a_budget_of_its_own(self, cli, how):
        cli.install(cli.tmp / "vgpu", config(cli.cache))
        self._break(cli, how)
        first = cli.popen("init", "alloc", "40m", "hold", env=LIMIT)
        try:
            wait_line(first, "hold")
            r = cli.run("init", "alloc", "40m", "meminfo", env=LIMIT)
        finally:
            first.kill()
            first.wait()
        assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
        assert r.lines[-1] == ["meminfo", "0", "0", "0"]
        assert "device memory limits fail closed (0 bytes)" in r.stderr

    def test_without_a_config_file_a_foreign_file_still_means_per_process_accounting(self, cli):
        self._break(cli, "garbage")
        r = cli.run("init", "alloc", "64m", "alloc", "1", env=LIMIT)
        assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
        assert "accounting is per process from now on" in r.stderr


def test_the_slice_length_is_not_the_tenants_to_set(cli):
    """A slice of days never closes, so the compute limiter never pauses: where the config file
    rules, LIBVGPU_SM_SLICE_MS in the environment is ignored like the share itself."""
    cli.install(cli.tmp / "vgpu", config(cli.cache, sm="50"))
    r = cli.run("init", "launch", "1", env={**LIMIT, "LIBVGPU_SM_SLICE_MS": "2000000000", "LIBCUDA_LOG_LEVEL": "3"})
    assert r.codes("launch") == [CUDA_SUCCESS]
    assert "compute limiter on (slice 250 ms" in r.stderr
    assert "LIBVGPU_SM_SLICE_MS='2000000000' in the environment is ignored" in r.stderr


def test_a_pool_is_charged_to_its_own_device(cli):
    """A pool made on card 1 takes its memory on card 1, whichever card's context is current: charged
    to the caller's card 0, a two-card container filled card 1 past its limit from card 0."""
    env = {"FAKE_GPU_COUNT": "2", "CUDA_DEVICE_MEMORY_LIMIT_0": "64m", "CUDA_DEVICE_MEMORY_LIMIT_1": "64m"}
    r = attack(cli, "init", "pool_on", "1", "60m", "alloc", "60m", env=env)
    assert r.codes("pool_on") == [CUDA_SUCCESS]
    assert r.codes("alloc") == [CUDA_SUCCESS]  # card 0 holds nothing yet
    region = read_region(cli.cache)
    used = {d.uuid: sum(s.used[i] for s in region.slots) for i, d in enumerate(region.devices) if d.uuid}
    assert used == {"GPU-face0000-0000-0000-0000-000000000000": 60 * MIB,
                    "GPU-face0001-0000-0000-0000-000000000000": 60 * MIB}  # fmt: skip


def test_a_device_table_written_full_does_not_lift_the_limit(cli):
    """The region is the tenant's to write: a device table that reads full (and no entry naming the
    card) left a later process's card unregistered, its allocations uncharged and unlimited."""
    cli.install(cli.tmp / "vgpu", config(cli.cache))
    assert cli.run("init", "alloc", "1m", env=LIMIT).codes("alloc") == [CUDA_SUCCESS]
    with open(cli.cache, "r+b") as f:
        f.seek(32)
        f.write(struct.pack("<I", 16))  # device_count: the table is full
        f.seek(4096)
        f.write(b"GPU-not-this-card\0")  # entry 0 no longer names the card
    r = cli.run("init", "alloc", "100m", "alloc", "1m", "meminfo", env=LIMIT)
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.lines[-1] == ["meminfo", "0", "0", "0"]
    assert "no room for the card in its device table" in r.stderr


def test_a_rewritten_device_index_does_not_pick_a_larger_limit(cli):
    """A device entry's phys_index (and its limit) are the tenant's to rewrite: a process's cap comes
    from the index it resolved for the card itself, not from the entry."""
    cli.install(cli.tmp / "vgpu", config(cli.cache, extra="CUDA_DEVICE_MEMORY_LIMIT_1=1g\n"))
    assert cli.run("init", "alloc", "1m", env=LIMIT).codes("alloc") == [CUDA_SUCCESS]
    with open(cli.cache, "r+b") as f:
        f.seek(4096 + 96)
        f.write(struct.pack("<QII", 2**64 - 1, 100, 1))  # limit: none; sm; phys_index: the 1 GiB card's
    r = cli.run("init", "alloc", "100m", "alloc", "64m", env={"FAKE_GPU_MIB": "1024"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]


class TestCardsByUuid:
    """Where the config file lists the container's cards (LIBVGPU_DEVICE_UUID_<i>), a card's limit is
    found by its UUID: not by a CUDA ordinal that CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER or the
    node's PCI order shift away from the device plugin's index."""

    CARD0, CARD1 = "GPU-face0000-0000-0000-0000-000000000000", "GPU-face0001-0000-0000-0000-000000000000"
    # the plugin's index 0 is the node's second card: a different order than the driver's
    FILE = f"CUDA_DEVICE_MEMORY_LIMIT_1=64m\nLIBVGPU_DEVICE_UUID_0={CARD1}\nLIBVGPU_DEVICE_UUID_1={CARD0}\n"

    def _install(self, cli):
        cli.install(cli.tmp / "vgpu", config(cli.cache, limit="32m", extra=self.FILE))

    @pytest.mark.parametrize("visible", [None, "1", "1,0", "GPU-face0001"])
    def test_each_card_gets_its_own_limit_whatever_the_ordinals(self, cli, visible):
        self._install(cli)
        env = {"FAKE_GPU_COUNT": "2"} | ({"CUDA_VISIBLE_DEVICES": visible} if visible else {})
        r = cli.run("init", "meminfo", "nvmlmem", "0", "nvmlmem", "1", env=env)
        ordinal0_is_card1 = visible is not None  # every remap above puts CARD1 first
        total = {"meminfo": r.op(1)[3], "nvml0": r.op(2)[2], "nvml1": r.op(3)[2]}
        assert total == {
            "meminfo": str((32 if ordinal0_is_card1 else 64) * MIB),  # CUDA ordinal 0
            "nvml0": str(64 * MIB),  # NVML index 0 is CARD0: the plugin's index 1
            "nvml1": str(32 * MIB),  # NVML index 1 is CARD1: the plugin's index 0
        }

    def test_a_card_the_file_does_not_list_gets_no_memory(self, cli):
        cli.install(cli.tmp / "vgpu", config(cli.cache, extra=f"LIBVGPU_DEVICE_UUID_0={self.CARD1}\n"))
        r = cli.run("init", "alloc", "1", env={"FAKE_GPU_COUNT": "2"})
        assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
        assert "is not one of the container's cards" in r.stderr


def _busy_by_card(cli) -> dict[str, int]:
    """Busy time the compute limiter charged per card (device UUID -> ns)."""
    return {d.uuid: d.busy_ns_total for d in read_region(cli.cache).devices if d.uuid}


CARD0, CARD1 = "GPU-face0000-0000-0000-0000-000000000000", "GPU-face0001-0000-0000-0000-000000000000"
SM = {"CUDA_DEVICE_SM_LIMIT": "50", "FAKE_KERNEL_US": "1000", "FAKE_GPU_COUNT": "2"}


@pytest.mark.parametrize("door", ["sym", "dlsym", "procaddr"])
@pytest.mark.parametrize("entry", ["cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync"])
def test_deprecated_launches_go_through_the_compute_limiter(cli, entry, door):
    """cuLaunch, cuLaunchGrid and cuLaunchGridAsync launch kernels too: unhooked, a program that
    launched that way was never measured nor paced. One launch opens a slice that the exit closes,
    charging its busy time to the card (no share asserted: only that the limiter saw the launch)."""
    r = attack(cli, "init", "legacy", entry, door, env=SM)
    assert r.codes("legacy") == [CUDA_SUCCESS]
    busy = _busy_by_card(cli)
    assert busy[CARD0] > 0


@pytest.mark.parametrize("door", ["sym", "dlsym", "procaddr"])
def test_a_multi_device_launch_is_paced_on_every_card(cli, door):
    """cuLaunchCooperativeKernelMultiDevice runs one kernel on each listed stream's card: each card's
    limiter sees its launch, not only the calling context's card."""
    r = attack(cli, "init", "legacy", "multi", door, env=SM)
    assert r.codes("legacy") == [CUDA_SUCCESS]
    busy = _busy_by_card(cli)
    assert busy.keys() == {CARD0, CARD1}
    assert busy[CARD0] > 0 and busy[CARD1] > 0


def test_an_async_allocation_is_charged_to_its_streams_card(cli):
    """cuMemAllocAsync takes its memory from the current pool of the stream's card: charged to the
    calling context's card 0, a two-card container filled card 1 past its limit from card 0."""
    env = {"FAKE_GPU_COUNT": "2", "CUDA_DEVICE_MEMORY_LIMIT_0": "64m", "CUDA_DEVICE_MEMORY_LIMIT_1": "64m"}
    r = attack(cli, "init", "async_on", "1", "60m", "alloc", "60m", "async_on", "1", "8m", env=env)
    assert r.codes("async_on") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]  # card 1 is full
    assert r.codes("alloc") == [CUDA_SUCCESS]  # card 0 holds nothing yet
    region = read_region(cli.cache)
    used = {d.uuid: sum(s.used[i] for s in region.slots) for i, d in enumerate(region.devices) if d.uuid}
    assert used == {CARD0: 60 * MIB, CARD1: 60 * MIB}


class TestDeepBind:
    """A library loaded with RTLD_DEEPBIND looks its symbols up in itself and its own dependencies
    first: linked against libcuda.so.1, its allocations went to the driver and never through the
    preloaded hooks (Python: ctypes.CDLL(path, mode=os.RTLD_DEEPBIND)). libvgpu drops the flag from
    every dlopen and dlmopen, and hands its own dlopen out where a lookup finds the C library's."""

    @staticmethod
    def _lib(cli, name: str) -> str:
        return str(cli.build / "testlibs" / name)

    @pytest.mark.parametrize("door", ["dlopen", "dlmopen"])
    def test_a_deepbound_library_is_held_to_the_limit(self, cli, door):
        r = attack(cli, "init", "deep", door, self._lib(cli, "libdeep.so"), "100m",
                   "deep", door, self._lib(cli, "libdeep.so"), "60m", "alloc", "8m")  # fmt: skip
        assert r.codes("deep") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
        assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]  # the library's 60 MiB are charged

    @pytest.mark.parametrize("version", LIBC_VERSIONS)
    def test_the_c_librarys_dlopen_by_version_drops_deepbind(self, cli, version):
        r = attack(cli, "init", "deep", version, self._lib(cli, "libdeep.so"), "100m")
        assert r.codes("deep") == [CUDA_ERROR_OUT_OF_MEMORY]

    def test_the_next_dlopen_after_libvgpu_drops_deepbind(self, cli):
        """dlsym(RTLD_NEXT, "dlopen") from a library preloaded after libvgpu finds the C library's."""
        env = {"LD_PRELOAD": f"{cli.lib} {self._lib(cli, 'libnextopen.so')}"}
        r = attack(cli, "init", "deep", "next", self._lib(cli, "libdeep.so"), "100m", env=env)
        assert r.codes("deep") == [CUDA_ERROR_OUT_OF_MEMORY]

    def test_pythons_ctypes_deepbind_is_held_to_the_limit(self, cli):
        script = (
            "import ctypes, os, sys\n"
            "lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_DEEPBIND)\n"
            "lib.deep_alloc.argtypes = [ctypes.c_size_t]\n"
            "print('init', lib.deep_init())\n"
            "print('deep', lib.deep_alloc(100 << 20))\n"
            "print('deep', lib.deep_alloc(60 << 20))\n"
        )
        p = subprocess.run([sys.executable, "-c", script, self._lib(cli, "libdeep.so")], env=cli.env(LIMIT),
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        r = parse(p.returncode, p.stdout, p.stderr)
        assert r.codes("init") == [CUDA_SUCCESS], p.stderr
        assert r.codes("deep") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]

    @pytest.mark.parametrize("how", ["dlopen", "dlmopen"])
    @pytest.mark.parametrize("mode", ["now", "deep"])
    def test_the_callers_runpath_still_finds_its_libraries(self, cli, how, mode):
        """glibc searches the RUNPATH of the object that called dlopen: libvgpu's wrapper hands the
        call on without becoming the caller, so a library only that RUNPATH finds still loads."""
        r = attack(cli, "open", "librpdep.so", "runpath", self._lib(cli, "runpath/librunpath.so"), how, mode)
        assert r.lines == [["open", "0"], ["runpath", "42"]], r.stderr  # only the RUNPATH finds it

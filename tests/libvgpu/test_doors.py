"""The three doors into the driver: symbol interposition, dlopen+dlsym, and
cuGetProcAddress(_v2) by name x version x per-thread-stream flag. For each we assert the exact
function handed back (object:symbol) and that a wrapped function really enforces the limit.
"""

from __future__ import annotations

import subprocess

import pytest

from .conftest import CUDA_ERROR_NOT_FOUND, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "64m"}
PTDS = "2"  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

PROCADDR = [
    # symbol, cudaVersion, flags -> what the caller must get
    ("cuMemAlloc", "3000", "0", "libvgpu.so:cuMemAlloc"),  # v1 ABI for a v1 request (core#57)
    ("cuMemAlloc", "12000", "0", "libvgpu.so:cuMemAlloc_v2"),
    ("cuMemGetInfo", "3000", "0", "libvgpu.so:cuMemGetInfo"),
    ("cuMemGetInfo", "13000", "0", "libvgpu.so:cuMemGetInfo_v2"),
    ("cuDeviceTotalMem", "12000", "0", "libvgpu.so:cuDeviceTotalMem_v2"),
    ("cuLaunchKernel", "12000", "0", "libvgpu.so:cuLaunchKernel"),
    ("cuLaunchKernel", "12000", PTDS, "libvgpu.so:cuLaunchKernel_ptsz"),
    ("cuMemAllocAsync", "12000", PTDS, "libvgpu.so:cuMemAllocAsync_ptsz"),
    ("cuMemFreeAsync", "12000", "0", "libvgpu.so:cuMemFreeAsync"),
    ("cuGraphLaunch", "12000", PTDS, "libvgpu.so:cuGraphLaunch_ptsz"),
    ("cuLaunch", "12000", "0", "libvgpu.so:cuLaunch"),  # deprecated, still launches kernels
    ("cuLaunchGridAsync", "13000", PTDS, "libvgpu.so:cuLaunchGridAsync"),  # no _ptsz: the one function
    ("cuLaunchCooperativeKernelMultiDevice", "12000", "0", "libvgpu.so:cuLaunchCooperativeKernelMultiDevice"),
    ("cuGetProcAddress", "12000", "0", "libvgpu.so:cuGetProcAddress_v2"),
    ("cuGetProcAddress", "11030", "0", "libvgpu.so:cuGetProcAddress"),
    # not wrapped: the driver's exact answer, version honoured
    ("cuMemPrefetchAsync", "8000", "0", "libcuda.so.1:cuMemPrefetchAsync"),
    ("cuMemPrefetchAsync", "12020", "0", "libcuda.so.1:cuMemPrefetchAsync_v2"),
    ("cuDeviceGet", "12000", PTDS, "libcuda.so.1:cuDeviceGet"),
]


@pytest.mark.parametrize(
    ("sym", "ver", "flags", "want"), PROCADDR, ids=[f"{p[0]}@{p[1]}/{p[2]}" for p in PROCADDR]
)
def test_cugetprocaddress_v2_returns_our_wrapper_of_the_exact_version(cli, sym, ver, flags, want):
    r = cli.run("procaddr", sym, ver, flags, "procaddr1", sym, ver, flags)
    assert r.op(0) == ["procaddr", "0", "0", want]
    assert r.op(1) == ["procaddr1", "0", "-1", want]  # v1 entry point has no status argument


def test_cugetprocaddress_misses_keep_the_drivers_status(cli):
    r = cli.run("procaddr", "cuNoSuchThing", "12000", "0", "procaddr", "cuMemAllocAsync", "11000", "0")
    assert r.op(0) == ["procaddr", str(CUDA_ERROR_NOT_FOUND), "1", "NULL"]  # SYMBOL_NOT_FOUND
    assert r.op(1) == ["procaddr", str(CUDA_ERROR_NOT_FOUND), "2", "NULL"]  # VERSION_NOT_SUFFICIENT


@pytest.mark.parametrize("ver", ["3000", "12000"])
def test_function_from_cugetprocaddress_enforces_the_limit(cli, ver):
    r = cli.run("init", "procaddr_alloc", ver, "64m", "procaddr_alloc", ver, "1", env=LIMIT)
    assert r.codes("procaddr_alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_dlopen_dlsym_gets_wrappers_for_hooked_names_only(cli):
    r = cli.run(
        "dlsym", "cuMemAlloc_v2", "dlsym", "cuMemAlloc", "dlsym", "cuDeviceGet", "dlsym", "curl_easy_init",
        "dlsym", "cuGetProcAddress_v2", "dlsym_nvml", "nvmlDeviceGetMemoryInfo_v2", "dlsym_nvml", "nvmlInit_v2",
        "dlsym_default", "cuMemFree_v2", "dlsym_next", "cuMemFree_v2",
    )  # fmt: skip
    assert [ln[1] for ln in r.lines] == [
        "libvgpu.so:cuMemAlloc_v2",
        "libvgpu.so:cuMemAlloc",
        "libcuda.so.1:cuDeviceGet",
        "NULL",
        "libvgpu.so:cuGetProcAddress_v2",
        "libvgpu.so:nvmlDeviceGetMemoryInfo_v2",
        "libnvidia-ml.so.1:nvmlInit_v2",
        "libvgpu.so:cuMemFree_v2",
        "libvgpu.so:cuMemFree_v2",  # RTLD_NEXT from the program: the preloaded object comes next
    ]


def test_dlsym_user_is_held_to_the_limit(cli):
    r = cli.run("init", "dlsym_alloc", "64m", "dlsym_alloc", "1", env=LIMIT)
    assert r.codes("dlsym_alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_disabled_control_hands_out_the_drivers_functions(cli):
    r = cli.run(
        "dlsym", "cuMemAlloc_v2", "procaddr", "cuMemAlloc", "12000", "0", env={"CUDA_DISABLE_CONTROL": "true"}
    )
    assert r.op(0) == ["dlsym", "libcuda.so.1:cuMemAlloc_v2"]
    assert r.op(1) == ["procaddr", "0", "0", "libcuda.so.1:cuMemAlloc_v2"]


def test_only_entry_points_are_exported(built):
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(built / "libvgpu.so")], capture_output=True, text=True, check=True
    ).stdout
    names = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
    assert "dlsym" in names and "cuMemAlloc_v2" in names and "nvmlDeviceGetMemoryInfo" in names
    dl = {"dlsym", "dlvsym", "dlopen", "dlmopen"}
    assert {n for n in names if not (n.startswith(("cu", "nvml")) or n in dl)} == set()


def test_dlvsym_door_hands_out_the_wrapper(cli):
    # The fake driver versions its symbols FAKE_CUDA_1 (tests/fake_cuda.map); a versioned lookup
    # of a hooked name is swapped for our hook like dlsym's, other names and versions are not.
    r = cli.run("init", "dlvsym", "cuMemAlloc_v2", "FAKE_CUDA_1", "dlvsym", "cuDeviceGet", "FAKE_CUDA_1",
                "dlvsym", "cuMemAlloc_v2", "OTHER_1")  # fmt: skip
    assert r.op(1) == ["dlvsym", "libvgpu.so:cuMemAlloc_v2"]
    assert r.op(2) == ["dlvsym", "libcuda.so.1:cuDeviceGet"]  # not hooked: the driver's own
    assert r.op(3) == ["dlvsym", "NULL"]  # no such version: the real answer, untouched

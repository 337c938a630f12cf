"""libvgpu, its fake driver and the test programs build against the cuda.h of every CUDA major the
library supports, and the harness's core cases pass against each build.

The headers come from PyPI's CUDA runtime wheels (setup.cfg's test extras): 12.2 is the oldest
header libvgpu supports, 13 is what the device plugin image builds with
(images/build-requirements.txt). Entry points a header lacks are compiled out (src/hooks.h): a
12.2 build neither exports nor hooks cuCtxCreate_v4 (CUDA 12.5), so that door is the driver's own.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from tests.ci import skip_or_fail

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB, Cli, make_test_bins

# (id, distribution, include directory inside it, CUDA_VERSION range [low, high))
HEADERS = [
    ("cuda12.2", "nvidia-cuda-runtime-cu12", "nvidia/cuda_runtime/include", (12020, 12030)),
    ("cuda13", "nvidia-cuda-runtime", "nvidia/cu13/include", (13000, 14000)),
]


def header_dir(dist: str, include: str, versions: tuple[int, int]) -> Path:
    """The include directory of wheel `dist` holding a cuda.h of CUDA_VERSION in `versions`."""
    try:
        cuda_h = Path(importlib.metadata.distribution(dist).locate_file(f"{include}/cuda.h"))
    except importlib.metadata.PackageNotFoundError:
        skip_or_fail(f"{dist} is not installed (setup.cfg's test extras): no cuda.h to build against")
    if not cuda_h.is_file():
        skip_or_fail(f"{dist} is installed but has no {include}/cuda.h")
    m = re.search(r"^#define CUDA_VERSION (\d+)", cuda_h.read_text(errors="replace"), re.M)
    assert m and versions[0] <= int(m.group(1)) < versions[1], (cuda_h, m and m.group(1))
    return cuda_h.parent


@pytest.fixture(scope="module", params=HEADERS, ids=[h[0] for h in HEADERS])
def header_build(request, tmp_path_factory) -> tuple[Path, int]:
    """(build directory, CUDA_VERSION) of libvgpu and the harness built against one header."""
    name, dist, include, versions = request.param
    inc = header_dir(dist, include, versions)
    build = make_test_bins(tmp_path_factory.mktemp(name) / "build", inc)
    version = int(re.search(r"^#define CUDA_VERSION (\d+)", (inc / "cuda.h").read_text(), re.M).group(1))
    return build, version


@pytest.fixture
def hcli(header_build, tmp_path) -> tuple[Cli, int]:
    build, version = header_build
    return Cli(build, tmp_path), version


def test_limits_hold(hcli):
    cli, _ = hcli
    r = cli.run("init", "meminfo", "alloc", "65m", "alloc", "64m", "alloc", "1",
                env={"CUDA_DEVICE_MEMORY_LIMIT": "64m"})  # fmt: skip
    assert r.op(1) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_config_file_limits_a_scrubbed_process(hcli):
    cli, _ = hcli
    cli.install(cli.tmp / "vgpu", f"vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT_0=32m\n"
                                  f"CUDA_DEVICE_MEMORY_SHARED_CACHE={cli.cache}\n")  # fmt: skip
    r = cli.run_clean("init", "alloc", "33m", "alloc", "32m")
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]


@pytest.mark.parametrize("version", ["1", "2", "3"])
def test_created_contexts_are_charged(hcli, version):
    cli, _ = hcli
    r = cli.run("init", "ctxcreate", "0", version, "meminfo",
                env={"CUDA_DEVICE_MEMORY_LIMIT": "256m", "FAKE_GPU_MIB": "1024", "FAKE_CTX_MIB": "40"})  # fmt: skip
    assert r.codes("ctxcreate") == [CUDA_SUCCESS]
    assert r.op(2) == ["meminfo", "0", str((256 - 80) * MIB), str(256 * MIB)]  # primary + created


def test_doors_hand_out_the_hooks_the_header_has(hcli):
    cli, version = hcli
    r = cli.run("procaddr", "cuMemAlloc", "3020", "0", "procaddr", "cuCtxCreate", "12050", "0",
                "dlsym", "cuMemAlloc_v2")  # fmt: skip
    assert r.op(0) == ["procaddr", "0", "0", "libvgpu.so:cuMemAlloc_v2"]
    v4 = "libvgpu.so:cuCtxCreate_v4" if version >= 12050 else "libcuda.so.1:cuCtxCreate_v4"
    assert r.op(1) == ["procaddr", "0", "0", v4]
    assert r.op(2)[1] == "libvgpu.so:cuMemAlloc_v2"


def test_ways_out_of_the_memory_limit_stay_closed(hcli):
    # VMM create/map/release, a graph memory node, the device heap: hooked under every header
    cli, _ = hcli
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "2g", "FAKE_GPU_MIB": "16384"}
    vmm = [
        a for k in range(3) for a in ("vmm", "0", "1g", "vmmmap", str(1 + 2 * k), "0", "free", str(1 + 2 * k))
    ]
    r = cli.run("init", "graphcreate", "graphalloc", "0", "6g", "instantiate", "0", "flags", "setlimit", "heap", "6g",
                *vmm, env=env)  # fmt: skip
    assert r.codes("vmm") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.codes("instantiate") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.codes("setlimit") == [CUDA_ERROR_OUT_OF_MEMORY]

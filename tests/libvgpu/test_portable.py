"""The portable builds (make -C libvgpu portable, zig cc for glibc 2.17): for x86_64 and aarch64,
no symbol bound to a glibc version newer than 2.17, no C++ runtime, only the C library's own
objects needed; and the x86_64 build enforces limits in the CPU harness like the host build."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys

import pytest

from .conftest import BUILD, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, LIBVGPU, MIB
from .test_config_file import config
from .test_tenant_doors import attack

TARGETS = {"x86_64-linux-gnu.2.17": "Advanced Micro Devices X86-64", "aarch64-linux-gnu.2.17": "AArch64"}
ALLOWED_NEEDED = {"libc.so.6", "libpthread.so.0", "libdl.so.2"}


@pytest.fixture(scope="module")
def portable(built):
    if importlib.util.find_spec("ziglang") is None:
        pytest.skip("the portable builds need zig: pip install ziglang (in the test extras)")
    if not shutil.which("readelf"):
        pytest.skip("readelf (binutils) not installed")
    zig = f"{sys.executable} -m ziglang"  # the interpreter that has ziglang, not whatever python3 is
    r = subprocess.run(
        ["make", "-s", "-C", str(LIBVGPU), "portable", f"ZIG={zig}"], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.fail(f"make -C libvgpu portable failed:\n{r.stdout}{r.stderr}", pytrace=False)
    return {t: BUILD / t / "libvgpu.so" for t in TARGETS}


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True, text=True).stdout


def versions(lib) -> set[str]:
    """Every symbol version the library's dynamic symbols are bound to (readelf --dyn-syms)."""
    return set(re.findall(r"@@?([A-Z][A-Z_]*[0-9][0-9.]*)", readelf("--dyn-syms", str(lib))))


@pytest.mark.parametrize("target", list(TARGETS))
def test_no_symbol_newer_than_glibc_2_17_and_no_cxx_runtime(portable, target):
    lib = portable[target]
    assert TARGETS[target] in readelf("-h", str(lib))
    vers = versions(lib)
    glibc = {v for v in vers if v.startswith("GLIBC_")}
    assert glibc, vers  # the check reads real bindings (dlopen, pthread_once, ...)
    newest = max(tuple(int(x) for x in v[6:].split(".")) for v in glibc)
    assert newest <= (2, 17), sorted(glibc)
    assert vers == glibc, f"non-glibc versions (C++ runtime, libgcc): {sorted(vers - glibc)}"
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf("-d", str(lib))))
    assert needed <= ALLOWED_NEEDED, needed
    exported = {ln.split()[-1] for ln in readelf("--dyn-syms", str(lib)).splitlines()
                if " DEFAULT " in ln and " UND " not in ln and "FUNC" in ln}  # fmt: skip
    assert {"cuMemAlloc_v2", "cuLaunchKernel", "dlsym", "dlvsym", "dlopen", "dlmopen",
            "nvmlDeviceGetMemoryInfo"} <= exported  # fmt: skip


def test_objdump_agrees_on_x86_64(portable):
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) not installed")
    out = subprocess.run(["objdump", "-T", str(portable["x86_64-linux-gnu.2.17"])], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    found = set(re.findall(r"\(?(GLIBC_[0-9.]+)\)?", out))
    assert found and max(tuple(int(x) for x in v[6:].split(".")) for v in found) <= (2, 17), sorted(found)
    assert "GLIBCXX" not in out and "CXXABI" not in out


def test_x86_64_portable_build_enforces_limits(cli, portable):
    cli.install(cli.tmp / "vgpu", config(cli.cache), lib=portable["x86_64-linux-gnu.2.17"])
    r = cli.run_clean("init", "meminfo", "alloc", "65m", "alloc", "60m", "dlsym_alloc", "5m", "dlvsym",
                      "cuMemAlloc_v2", "FAKE_CUDA_1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.op(1) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert r.codes("dlsym_alloc") == [CUDA_ERROR_OUT_OF_MEMORY]  # door B still hooked
    assert r.op(5) == ["dlvsym", "libvgpu.so:cuMemAlloc_v2"]  # the real dlvsym found by ELF lookup


@pytest.mark.parametrize("how", ["dlopen", "dlmopen"])
def test_x86_64_portable_build_drops_deepbind_and_keeps_the_callers_runpath(cli, portable, how):
    """zig's clang makes the dlopen wrapper a guaranteed tail call (musttail): glibc still sees the
    tenant's library as the caller and searches its RUNPATH."""
    cli.install(cli.tmp / "vgpu", lib=portable["x86_64-linux-gnu.2.17"])
    libs = cli.build / "testlibs"
    r = attack(cli, "init", "deep", how, str(libs / "libdeep.so"), "100m",
               "runpath", str(libs / "runpath" / "librunpath.so"), how, "deep")  # fmt: skip
    assert r.lines == [["init", "0"], ["deep", str(CUDA_ERROR_OUT_OF_MEMORY)], ["runpath", "42"]], r.stderr


IMAGE = LIBVGPU.parent / "images" / "device-plugin"


def test_device_plugin_image_ships_both_portable_builds():
    text = (IMAGE / "Dockerfile").read_text()
    # cuda.h from PyPI's nvidia-cuda-runtime 13 wheel (no CUDA image); tests/chart/test_image_build.py builds it.
    assert "make -C libvgpu clean portable" in text and '/nvidia/cu13" \\' in text
    for arch in ("x86_64", "aarch64"):
        src = f"/src/libvgpu/build/{arch}-linux-gnu.2.17/libvgpu.so"
        assert f"COPY --from=libvgpu {src} /k8s-vgpu/lib/nvidia/{arch}/libvgpu.so" in text


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_vgpu_init_installs_the_build_of_the_nodes_architecture(tmp_path, arch):
    lib = tmp_path / "lib"
    for a in ("x86_64", "aarch64"):
        (lib / a).mkdir(parents=True)
        (lib / a / "libvgpu.so").write_bytes(f"\x7fELF {a}".encode())
    (lib / "libvgpu.so").write_bytes(b"\x7fELF image default")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "uname").write_text(f"#!/bin/sh\necho {arch}\n")
    (fake_bin / "uname").chmod(0o755)
    dest = tmp_path / "host" / "vgpu"
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "VGPU_LIB_DIR": str(lib)}
    subprocess.run(["sh", str(IMAGE / "vgpu-init.sh"), str(dest)], env=env, check=True, capture_output=True)
    assert (dest / "libvgpu.so").read_bytes() == f"\x7fELF {arch}".encode()
    # an architecture the image has no build for falls back to the image's own library
    (fake_bin / "uname").write_text("#!/bin/sh\necho riscv64\n")
    subprocess.run(["sh", str(IMAGE / "vgpu-init.sh"), str(dest)], env=env, check=True, capture_output=True)
    assert (dest / "libvgpu.so").read_bytes() == b"\x7fELF image default"

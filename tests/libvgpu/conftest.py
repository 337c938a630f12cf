"""CPU harness for libvgpu: build the library, the fake driver/NVML and the test program once
per session, then run the program under LD_PRELOAD against the fakes.

Why a scriptable client (libvgpu/tests/t_cli.c) instead of one C program per case: the cases
differ only in the sequence of driver calls and the environment, so each test states both in
one line and asserts on the exact result codes and numbers the program prints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBVGPU = REPO / "libvgpu"
BUILD = LIBVGPU / "build"
MIB = 1 << 20

# CUresult numbers the tests assert on (cuda.h).
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NOT_FOUND = 500


@dataclass
class Result:
    """One run of t_cli: `lines` are the per-operation output lines split into fields."""

    returncode: int
    lines: list[list[str]]
    stderr: str

    def op(self, index: int) -> list[str]:
        """Fields of the index-th output line (0-based)."""
        return self.lines[index]

    def codes(self, name: str) -> list[int]:
        """CUresult codes of every line of operation `name`, in order."""
        return [int(f[1]) for f in self.lines if f[0] == name]

    def error_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if "ERROR" in ln]


@pytest.fixture(scope="session")
def built() -> Path:
    """Builds libvgpu.so, the fakes and t_cli (make -C libvgpu test-bins); returns BUILD."""
    if not shutil.which(os.environ.get("CC", "gcc")) and not shutil.which("cc"):
        pytest.skip("libvgpu tests need a C compiler (gcc or cc); none on PATH")
    if not shutil.which("make"):
        pytest.skip("libvgpu tests need make; not on PATH")
    cuda_h = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda.h"
    if not cuda_h.exists():
        pytest.skip(f"libvgpu tests need the CUDA driver API header: {cuda_h} not found (set CUDA_HOME)")
    return make_test_bins()


def make_test_bins(build: Path = BUILD, cuda_include: Path | None = None) -> Path:
    """Runs ``make -C libvgpu test-bins`` into `build` (libvgpu.so, the fakes, the test programs),
    against the cuda.h in `cuda_include` (default: CUDA_HOME's); returns `build`. Fails the test
    with make's output when the build fails."""
    cmd = ["make", "-s", "-C", str(LIBVGPU), "test-bins"]
    if build != BUILD:
        cmd.append(f"BUILD={build}")
    if cuda_include is not None:
        cmd.append(f"CUDA_HOME={cuda_include.parent}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}", pytrace=False)
    return build


class Cli:
    """Runs t_cli with a fresh cache file and fake GPU state per test (tmp_path)."""

    def __init__(self, build: Path, tmp: Path):
        self.build = build
        self.tmp = tmp
        self.cache = tmp / "vgpu.cache"
        self.state = tmp / "fakegpu.state"
        self.lib = build / "libvgpu.so"  # what LD_PRELOAD names; tests may point it at a copy

    def env(self, extra: dict[str, str] | None = None, *, preload: bool = True) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CUDA_", "FAKE_", "LIBVGPU_", "GPU_CORE"))
        }
        env.update(
            LD_LIBRARY_PATH=str(self.build / "fake"),
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.cache),
            FAKE_GPU_STATE=str(self.state),
            LIBCUDA_LOG_LEVEL="2",
        )
        if preload:
            env["LD_PRELOAD"] = str(self.lib)
        env.update(extra or {})
        return env

    def popen(
        self, *ops: str, env: dict[str, str] | None = None, preload: bool = True, cwd: Path | None = None
    ) -> subprocess.Popen:
        return subprocess.Popen(
            [str(self.build / "tests" / "t_cli"), *ops],
            env=self.env(env, preload=preload),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )

    def run(
        self, *ops: str, env: dict[str, str] | None = None, preload: bool = True, timeout: float = 20,
        cwd: Path | None = None,
    ) -> Result:
        p = self.popen(*ops, env=env, preload=preload, cwd=cwd)
        out, err = p.communicate(timeout=timeout)
        return parse(p.returncode, out, err)

    def install(self, where: Path, config: str | bytes | None = None, lib: Path | None = None) -> Path:
        """Copies libvgpu.so (or `lib`) into `where`, with `config` as vgpu.config beside it (as
        the device plugin mounts them); LD_PRELOAD then names the copy. Returns the copy."""
        where.mkdir(parents=True, exist_ok=True)
        self.lib = where / "libvgpu.so"
        shutil.copy(lib or self.build / "libvgpu.so", self.lib)
        if config is not None:
            cfg = where / "vgpu.config"
            cfg.write_bytes(config.encode() if isinstance(config, str) else config)
        return self.lib

    def run_clean(
        self, *ops: str, extra: dict[str, str] | None = None, timeout: float = 20, cwd: Path | None = None
    ) -> Result:
        """Runs t_cli as `env -i` would: only the loader's variables (LD_PRELOAD stands for
        /etc/ld.so.preload, LD_LIBRARY_PATH for the driver's location) and `extra`."""
        env = {"LD_PRELOAD": str(self.lib), "LD_LIBRARY_PATH": str(self.build / "fake"),
               "FAKE_GPU_STATE": str(self.state), **(extra or {})}  # fmt: skip
        p = subprocess.Popen(
            [str(self.build / "tests" / "t_cli"), *ops], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="backslashreplace",  # logs may echo raw file bytes
            cwd=cwd,
        )  # fmt: skip
        out, err = p.communicate(timeout=timeout)
        return parse(p.returncode, out, err)


def parse(returncode: int, out: str, err: str) -> Result:
    return Result(returncode, [ln.split() for ln in out.splitlines() if ln.strip()], err)


@pytest.fixture
def cli(built: Path, tmp_path: Path) -> Cli:
    return Cli(built, tmp_path)

"""The read-only config file beside the library: a process started with a scrubbed environment
(env -i, sshd, cron, a supervisor) is limited by it, shares the container's accounting, the
environment still wins where it speaks, and no malformed file crashes the library or leaves a
process unlimited."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB
from .region import read_region
from .test_multiproc import wait_line

UNLIMITED = (1 << 64) - 1


def config(cache, limit="64m", sm="0", extra="") -> str:
    return (
        "# written by the HAMi device plugin\n"
        "vgpu-config 1\n"
        f"CUDA_DEVICE_MEMORY_LIMIT_0={limit}\n"
        f"CUDA_DEVICE_SM_LIMIT={sm}\n"
        f"CUDA_DEVICE_MEMORY_SHARED_CACHE={cache}\n"
        "CUDA_TASK_PRIORITY=1\n" + extra
    )


def test_scrubbed_environment_is_limited_by_the_file(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache))
    r = cli.run_clean("init", "meminfo", "alloc", "65m", "alloc", "64m", "alloc", "1")
    assert r.returncode == 0, r.stderr
    assert r.op(1) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert "NOT limited" not in r.stderr


def test_scrubbed_child_shares_the_containers_accounting(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache))
    # the container's main process: limits from the environment (as the device plugin sets them)
    holder = cli.popen("init", "alloc", "40m", "hold", env={"CUDA_DEVICE_MEMORY_LIMIT_0": "64m"})
    try:
        wait_line(holder, "hold")
        r = cli.run_clean("init", "alloc", "30m", "alloc", "24m")
    finally:
        holder.kill()
        holder.wait()
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]


def test_environment_wins_over_the_file(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache, limit="64m"))
    r = cli.run("init", "alloc", "33m", "alloc", "32m", env={"CUDA_DEVICE_MEMORY_LIMIT": "32m"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]


def test_no_environment_no_file_is_unlimited_and_says_so_once(cli):
    cli.install(cli.tmp / "vgpu")  # no vgpu.config beside it
    r = cli.run_clean("init", "alloc", "1000m", "alloc", "1m")
    assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_SUCCESS]
    warn = [ln for ln in r.stderr.splitlines() if "NOT limited" in ln]
    assert len(warn) == 1 and str(cli.tmp / "vgpu" / "vgpu.config") in warn[0]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b"", "no 'vgpu-config 1' header"),
        (b"CUDA_DEVICE_MEMORY_LIMIT_0=64m\n", "expected 'vgpu-config 1'"),
        (b"vgpu-config 2\nCUDA_DEVICE_MEMORY_LIMIT_0=64m\n", "format version 2, this library reads 1"),
        (b"vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT_0 64m\n", "line 2: expected NAME=VALUE"),
        (b"vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT_0=64m\x00\n", "line 2 holds a NUL byte"),
        (b"vgpu-config 1\ncuda_device_memory_limit_0=64m\n", "line 2: bad variable name"),
        (b"vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT_0=" + b"9" * 600 + b"\n", "name or value too long"),
        (b"vgpu-config 1\n" + b"# padding\n" * 7000, "larger than 65536 bytes"),
        (b"vgpu-config 1\nCUDA_TASK_PRIORITY=1\n", "no CUDA_DEVICE_MEMORY_LIMIT"),
    ],
    ids=["empty", "no-header", "future-version", "no-equals", "nul", "lower-case", "long-value", "huge",
         "no-memory-limit"],
)  # fmt: skip
def test_malformed_file_fails_closed_with_one_reason(cli, text, why):
    cli.install(cli.tmp / "vgpu", text)
    r = cli.run_clean("init", "alloc", "1", "meminfo")
    assert r.returncode == 0
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    errors = r.error_lines()
    assert errors and "is malformed" in errors[0] and why in errors[0], r.stderr
    assert "fail closed" in errors[0]


def test_file_without_this_devices_limit_fails_closed_for_it(cli):
    text = config(cli.cache).replace("CUDA_DEVICE_MEMORY_LIMIT_0=64m", "CUDA_DEVICE_MEMORY_LIMIT_1=64m")
    cli.install(cli.tmp / "vgpu", text)
    r = cli.run_clean("init", "alloc", "1", extra={"FAKE_GPU_COUNT": "2"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert "no memory limit for device 0 in config file" in r.error_lines()[0]


def _mutations(base: bytes, n: int, seed: int):
    rng = random.Random(seed)
    lines = base.split(b"\n")
    for _ in range(n):
        b = bytearray(base)
        how = rng.randrange(7)
        if how == 0:  # flip bytes
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif how == 1:  # truncate
            b = b[: rng.randrange(len(b))]
        elif how == 2:  # insert garbage
            i = rng.randrange(len(b))
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        elif how == 3:  # drop a line
            ls = list(lines)
            del ls[rng.randrange(len(ls))]
            b = bytearray(b"\n".join(ls))
        elif how == 4:  # duplicate a line with another value
            ls = list(lines)
            ls.insert(
                rng.randrange(len(ls)), b"CUDA_DEVICE_MEMORY_LIMIT_0=" + str(rng.randrange(10**6)).encode()
            )
            b = bytearray(b"\n".join(ls))
        elif how == 5:  # CRLF and stray spaces
            b = bytearray(bytes(b).replace(b"\n", b"\r\n").replace(b"=", b" = ", rng.randint(0, 1)))
        else:  # a very long line
            b += b"X" * rng.randrange(1, 100000)
        yield bytes(b)


def test_fuzzed_files_never_crash_and_never_go_unlimited(cli):
    base = config(cli.cache).encode()
    checked = 0
    for i, text in enumerate(_mutations(base, 60, seed=16)):
        cli.install(cli.tmp / f"v{i}", text)
        cli.cache.unlink(missing_ok=True)  # each file starts a fresh container
        r = cli.run_clean("init", "alloc", "1", "meminfo", extra={"LIBCUDA_LOG_LEVEL": "3"})
        assert r.returncode == 0 and r.lines and r.lines[0][0] == "init", (text, r.stderr)
        mapped = re.findall(r"shared region (.+) mapped", r.stderr)
        if r.codes("alloc") == [CUDA_SUCCESS]:
            # the allocation passed, so a limit above 1 byte holds: it must not be "no limit"
            if mapped:  # the region file as the container shares it
                limit = read_region(Path(mapped[0])).devices[0].limit_bytes
            else:  # a private region (the mutated cache path was unusable): its one registration line
                (limit,) = (int(m) for m in re.findall(r"limit (\d+) bytes, sm", r.stderr))
            assert limit not in (0, UNLIMITED), (text, r.stderr)
            checked += 1
        for m in mapped:  # a mutated cache path may point outside tmp_path: leave nothing behind
            if not Path(m).is_relative_to(cli.tmp):
                Path(m).unlink(missing_ok=True)
    assert checked >= 5  # some mutations keep a readable file: those must still be limited


def test_libvgpu_reads_what_the_device_plugin_renders(cli):
    from device_plugin import vgpu_config

    envs = {"NVIDIA_VISIBLE_DEVICES": "GPU-x", "CUDA_DEVICE_MEMORY_LIMIT_0": "48m", "CUDA_DEVICE_SM_LIMIT": "0",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cli.cache), "LIBVGPU_CARD_DIR": str(cli.tmp / "cards")}  # fmt: skip
    cli.install(cli.tmp / "vgpu", vgpu_config.render(envs, priority="1"))
    r = cli.run_clean("init", "meminfo", "alloc", "49m", "alloc", "48m")
    assert r.op(1) == ["meminfo", "0", str(48 * MIB), str(48 * MIB)]
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert [ln for ln in r.stderr.splitlines() if "out of memory" not in ln] == []  # nothing else to say


HEADERS = [
    ("vgpu-config 1", True),
    ("vgpu-config 0001", True),
    ("vgpu-config  1", False),
    ("vgpu-config\t1", False),
    ("vgpu-config +1", False),
    ("vgpu-config 1 ", False),
    ("vgpu-config", False),
    ("vgpu-config 2", False),
    ("vgpu-config 4294967297", False),  # wrapped to 1 by a 32-bit read
    ("vgpu-config 1234567890", False),
]


@pytest.mark.parametrize(("header", "valid"), HEADERS, ids=[h for h, _ in HEADERS])
def test_header_is_read_alike_by_libvgpu_and_the_device_plugin(cli, header, valid):
    from device_plugin import vgpu_config

    text = f"{header}\nCUDA_DEVICE_MEMORY_LIMIT_0=64m\nCUDA_DEVICE_MEMORY_SHARED_CACHE={cli.cache}\n"
    try:
        vgpu_config.parse(text)
        py = True
    except vgpu_config.ConfigFileError:
        py = False
    cli.install(cli.tmp / "vgpu", text)
    r = cli.run_clean("init", "meminfo")
    c = "fail closed" not in r.stderr
    assert (py, c) == (valid, valid), r.stderr
    if valid:
        assert r.op(1) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]


def test_libvgpu_and_the_device_plugin_accept_the_same_files(cli):
    """Every mutated file the plugin could have written (UTF-8 text) is accepted by both readers or
    refused by both: the plugin's check of what it mounts says what libvgpu will do."""
    from device_plugin import vgpu_config

    base = config(cli.cache).encode()
    compared = {True: 0, False: 0}
    for i, data in enumerate(_mutations(base, 80, seed=7)):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        try:
            vgpu_config.parse(text)
            py = True
        except vgpu_config.ConfigFileError:
            py = False
        cli.install(cli.tmp / f"v{i}", data)
        cli.cache.unlink(missing_ok=True)
        r = cli.run_clean("init")
        # the file's own verdict (a valid file naming an unusable region fails closed for that reason)
        refused = re.search(r"config file \S+ (is malformed|unreadable)", r.stderr) is not None
        assert py is not refused, (data, r.stderr)
        compared[py] += 1
    assert compared[True] >= 5 and compared[False] >= 5, compared

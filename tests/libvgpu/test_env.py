"""The environment contract: every accepted form of a memory limit, fail-closed handling of
malformed values (one error line, limit 0, never "unlimited"), per-device overrides, the
CUDA_DISABLE_CONTROL switch by value, and LIBCUDA_LOG_LEVEL.
"""

from __future__ import annotations

import re

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB

ACCEPTED = [
    ("8000m", 8000 * MIB),
    ("8000M", 8000 * MIB),
    ("1g", 1024 * MIB),
    ("1G", 1024 * MIB),
    ("1Gi", 1024 * MIB),
    ("512Mi", 512 * MIB),
    ("1048576k", 1024 * MIB),
    ("1048576Ki", 1024 * MIB),
    ("1073741824", 1024 * MIB),
    ("0800m", 800 * MIB),  # decimal, not octal
    (" 64m ", 64 * MIB),
]


@pytest.mark.parametrize(("value", "total"), ACCEPTED, ids=[a[0].strip() for a in ACCEPTED])
def test_accepted_forms(cli, value, total):
    r = cli.run("init", "meminfo", env={"CUDA_DEVICE_MEMORY_LIMIT": value, "FAKE_GPU_MIB": "16384"})
    assert r.op(1) == ["meminfo", "0", str(total), str(total)]
    assert r.error_lines() == []


MALFORMED = ["1GB", "1.5g", "", "abc", "0x10m", "-1m", "8000mb", "1e9", "99999999999999999999", "20000000t"]


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_fails_closed_with_one_line(cli, value):
    r = cli.run("init", "alloc", "1", "meminfo", env={"CUDA_DEVICE_MEMORY_LIMIT": value})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(2) == ["meminfo", "0", "0", "0"]
    errors = r.error_lines()
    assert len(errors) == 1
    assert f"CUDA_DEVICE_MEMORY_LIMIT='{value}' is malformed" in errors[0]
    assert "fail closed" in errors[0]


SM_FORMS = [("50", 50), (" 50 ", 50), ("050", 50), ("50%", 50), ("0", 100), ("100", 100), ("101", 1), ("-1", 1),
            ("1e1", 1), ("", 1), ("50m", 1), ("5 0", 1), ("50%%", 1)]  # fmt: skip


@pytest.mark.parametrize(("value", "share"), SM_FORMS, ids=[repr(v) for v, _ in SM_FORMS])
def test_sm_limit_forms(cli, value, share):
    """Whole percent, optional spaces and one trailing %; 0 and 100 mean no limit; anything else
    fails closed to 1 % with one error line."""
    r = cli.run(
        "init",
        env={"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_SM_LIMIT": value, "LIBCUDA_LOG_LEVEL": "3"},
    )
    assert re.findall(r"limit \d+ bytes, sm (\d+)%", r.stderr) == [str(share)], r.stderr
    malformed = [ln for ln in r.error_lines() if "CUDA_DEVICE_SM_LIMIT=" in ln and "is malformed" in ln]
    assert len(malformed) == (1 if share == 1 else 0), r.stderr


def test_zero_is_not_unlimited(cli):
    r = cli.run("init", "alloc", "1", env={"CUDA_DEVICE_MEMORY_LIMIT": "0m"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert len(r.error_lines()) == 1 and "is zero" in r.error_lines()[0]


def test_per_device_value_overrides_the_global_one(cli):
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_MEMORY_LIMIT_0": "32m", "CUDA_DEVICE_MEMORY_LIMIT_1": "48m",
           "FAKE_GPU_COUNT": "2"}  # fmt: skip
    r = cli.run("init", "meminfo", "ctx", "1", "meminfo", env=env)
    assert r.op(1) == ["meminfo", "0", str(32 * MIB), str(32 * MIB)]
    assert r.op(3) == ["meminfo", "0", str(48 * MIB), str(48 * MIB)]


def test_malformed_per_device_value_does_not_fall_back_to_global(cli):
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_MEMORY_LIMIT_0": "1GB"}
    r = cli.run("init", "alloc", "1", env=env)
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0='1GB' is malformed" in r.error_lines()[0]


@pytest.mark.parametrize(("value", "enforced"), [("true", False), ("TRUE", False), ("1", False), ("false", True),
                                                 ("0", True), ("", True)])  # fmt: skip
def test_disable_control_by_value(cli, value, enforced):
    r = cli.run(
        "init",
        "alloc",
        "65m",
        "meminfo",
        env={"CUDA_DEVICE_MEMORY_LIMIT": "64m", "CUDA_DISABLE_CONTROL": value},
    )
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY if enforced else CUDA_SUCCESS]
    total = 64 * MIB if enforced else 1024 * MIB
    assert r.op(2)[3] == str(total)


def test_unknown_disable_value_keeps_control_on(cli):
    r = cli.run(
        "init", "alloc", "65m", env={"CUDA_DEVICE_MEMORY_LIMIT": "64m", "CUDA_DISABLE_CONTROL": "maybe"}
    )
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert "CUDA_DISABLE_CONTROL='maybe' is not true/false" in r.error_lines()[0]


@pytest.mark.parametrize(("level", "lines"), [("0", 0), ("1", 0), ("2", 1)])
def test_log_level_controls_the_oom_warning(cli, level, lines):
    r = cli.run("init", "alloc", "65m", env={"CUDA_DEVICE_MEMORY_LIMIT": "64m", "LIBCUDA_LOG_LEVEL": level})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert len([ln for ln in r.stderr.splitlines() if "out of memory" in ln]) == lines


def test_log_level_zero_silences_errors_too(cli):
    r = cli.run("init", "alloc", "1", env={"CUDA_DEVICE_MEMORY_LIMIT": "1GB", "LIBCUDA_LOG_LEVEL": "0"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.stderr == ""


def test_no_env_no_file_no_limit_but_one_loud_line(cli):
    # Neither the environment nor a config file beside the library: nothing is refused (a
    # process outside any HAMi container must keep working), and one warning says so.
    r = cli.run("init", "alloc", "1000m", "alloc", "10m", "meminfo")
    assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_SUCCESS]
    lines = r.stderr.splitlines()
    assert len(lines) == 1
    assert "no CUDA_DEVICE_MEMORY_LIMIT in the environment and no config file at " in lines[0]
    assert "device memory is NOT limited" in lines[0]

"""libvgpu's C boolean reader (include/vgpu_bool.h) against the shared truth table file, and
libvgpu's CUDA_DISABLE_CONTROL reading by that table (the Python side: tests/unit/test_booleans.py)."""

from __future__ import annotations

import subprocess

import pytest

from tests.bool_table import ROWS, TABLE

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS


def test_c_header_matches_table(built):
    r = subprocess.run([str(built / "tests" / "t_bool"), str(TABLE)], capture_output=True, text=True)
    assert r.stdout.strip().endswith(f"rows {len(ROWS)} mismatches 0"), r.stdout
    assert r.returncode == 0


@pytest.mark.parametrize(
    ("value", "reading"),
    [(v, r) for v, r in ROWS if v in ("yes", "On", "t", "no", "", " true", "maybe", "2")],
    ids=repr,
)
def test_libvgpu_disable_control_follows_table(cli, value, reading):
    r = cli.run(
        "init", "alloc", "65m", env={"CUDA_DEVICE_MEMORY_LIMIT": "64m", "CUDA_DISABLE_CONTROL": value}
    )
    want = CUDA_SUCCESS if reading == "true" else CUDA_ERROR_OUT_OF_MEMORY
    assert r.codes("alloc") == [want], (value, r.stderr)

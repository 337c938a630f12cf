"""The docs describe libvgpu's log levels as libvgpu/src/log.c applies them (level 0 is silent)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["docs/device-plugin.md", "docs/install.md", "docs/configuration.md", "docs/libvgpu.md"]


def test_log_c_states_the_levels_the_docs_repeat():
    src = (ROOT / "libvgpu/src/log.c").read_text()
    assert "Levels: 0 silent, 1 errors, 2 + warnings (default), 3 + info, 4 + debug." in src
    assert re.search(r"enum \{ VLOG_ERROR = 1, VLOG_WARN = 2, VLOG_INFO = 3, VLOG_DEBUG = 4 \}",
                     (ROOT / "libvgpu/src/log.h").read_text())


@pytest.mark.parametrize("page", PAGES)
def test_pages_say_level_0_is_silent(page):
    rows = [ln for ln in (ROOT / page).read_text().splitlines()
            if re.search(r"LIBCUDA_LOG_LEVEL|libCudaLogLevel", ln) and re.search(r"\b0\b", ln)
            and re.search(r"debug|error", ln, re.I)]
    assert rows, f"{page} no longer describes the levels"
    for row in rows:
        row = row.replace("`", "")
        assert "0 silent" in row, row
        assert not re.search(r"0 errors", row), row

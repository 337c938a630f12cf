"""No test outside the libvgpu suite skips in a way that CI=true cannot turn into a failure: every skip
for a missing module, tool or file goes through tests/ci.py, which fails instead under CI=true (what
.ci/run sets), so a deletion or a missing install step cannot turn the suite green."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import ci

TESTS = Path(__file__).resolve().parents[1]
RAW = re.compile(r"pytest\.skip\(|importorskip\(|mark\.skipif\(|mark\.skip\(|pytest\.xfail\(|mark\.xfail\(")


def test_no_raw_skip_outside_the_libvgpu_suite() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS).as_posix()
        if rel.startswith("libvgpu/") or rel in ("ci.py", "unit/test_ci_skips.py"):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RAW.search(line):
                found.append(f"tests/{rel}:{n}: {line.strip()}")
    assert not found, "skip through tests/ci.py (skip_or_fail, require_module, skip_unless):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize("in_ci", [True, False])
def test_a_missing_thing_fails_under_ci_and_skips_elsewhere(monkeypatch, in_ci: bool) -> None:
    monkeypatch.setattr(ci, "CI", in_ci)
    expected = pytest.fail.Exception if in_ci else pytest.skip.Exception
    with pytest.raises(expected, match="no such tool"):
        ci.skip_or_fail("no such tool")
    with pytest.raises(expected, match="hami_no_such_module"):
        ci.require_module("hami_no_such_module", "a module of the test extras")
    assert ci.require_module("json", "the standard library").dumps([]) == "[]"
    mark = ci.skip_unless(False, "absent")
    assert mark.args == (not in_ci,) and mark.kwargs["reason"] == "absent"


def test_reference_data_beside_the_checkout_skips_even_under_ci(monkeypatch, tmp_path) -> None:
    # ../shared is not the project's to install: its absence skips, CI or not.
    monkeypatch.setattr(ci, "CI", True)
    mark = ci.needs_shared(tmp_path / "absent.csv")
    assert mark.args == (True,) and "absent.csv" in mark.kwargs["reason"]
    assert ci.needs_shared(tmp_path).args == (False,)

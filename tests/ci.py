"""Skips that cannot hide a missing install step or a deletion.

A test that needs something the machine may lack (a module of the test extras, a system tool) skips
through these helpers. Under `CI=true`, which `.ci/run` runs with on a fresh
clone, the same condition fails the test instead: there, every such thing is installed by the project's
own files (setup.cfg's extras, `.ci/run`'s system packages), so its absence is a defect to see, not a
skip to count. tests/unit/test_ci_skips.py checks that no test outside the libvgpu suite skips any other
way.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

CI = os.environ.get("CI", "").strip().lower() == "true"


def skip_or_fail(reason: str) -> NoReturn:
    """pytest.skip(reason), or pytest.fail under CI=true."""
    if CI:
        pytest.fail(f"{reason} (CI=true: what the project installs must be present)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str) -> ModuleType:
    """The imported module `name`; skip_or_fail(reason) when it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        skip_or_fail(f"{reason}: {e}")


#: ../shared beside the checkout: the project's reference data (the Alibaba trace, HAMi's values file). It
#: lies outside the repository and no install step of the project can make it, so a test that needs it
#: skips wherever it is absent, under CI=true too: that is not a missing install step nor a deletion of
#: anything the repository holds (the repository's own copies, such as the values-file fixture, are
#: tested without it).
SHARED = Path(__file__).resolve().parents[2] / "shared"


def needs_shared(path: Path) -> pytest.MarkDecorator:
    """A mark that skips while `path` (under ../shared) is absent, whatever CI says."""
    return pytest.mark.skipif(
        not path.exists(), reason=f"{path} (reference data beside the checkout) is absent"
    )


def skip_unless(condition: bool, reason: str) -> pytest.MarkDecorator:
    """A mark that skips while `condition` is false, except under CI=true (the test then runs and fails)."""
    return pytest.mark.skipif(not condition and not CI, reason=reason)


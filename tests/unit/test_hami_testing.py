"""`hami.testing`: the deprecated alias of `kubefakes.apiserver` still works for one release and warns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_import_warns_and_gives_the_kubefakes_objects() -> None:
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from hami.testing.apiserver import FakeApiServer, Fault, Store, main\n"
        "import kubefakes.apiserver as k\n"
        "assert (FakeApiServer, Fault, Store, main) == (k.FakeApiServer, k.Fault, k.Store, k.main)\n"
        "print([f'{w.category.__name__}: {w.message}' for w in caught])\n"
    )
    r = _python("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "['DeprecationWarning: hami.testing is deprecated and will be removed in the next release; "
        "use kubefakes.apiserver']"
    )


def test_old_command_says_it_is_deprecated() -> None:
    r = _python("-m", "hami.testing.apiserver", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == (
        "python -m hami.testing.apiserver is deprecated; use python -m kubefakes.apiserver"
    )
    assert r.stdout.startswith("usage: python -m kubefakes.apiserver")

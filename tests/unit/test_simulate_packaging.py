"""Packaging of the simulator: plotting libraries are a `simulate` extra, and `hami simulate` runs
without matplotlib, saying so in one line only when plots are asked for."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLOTTING = {"matplotlib"}


def _requirements(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(
                line.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
            )
    return names


def test_plotting_is_a_simulate_extra_that_the_test_extra_also_pulls():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requires = _requirements(cfg["options"]["install_requires"])
    assert not PLOTTING & requires
    # numpy is installed by default: the scheduler extender's fragmentation policy computes with it
    assert "numpy" in requires
    extras = cfg["options.extras_require"]
    assert PLOTTING <= _requirements(extras["simulate"])
    assert PLOTTING <= _requirements(extras["test"])


def test_readme_main_job_installs_the_simulate_extra():
    readme = (ROOT / "README.md").read_text()
    assert "    pip install -e '.[simulate]' && hami simulate\n" in readme
    assert "    pip install -e '.[test]' && python -m pytest -q\n" in readme


def _hami_without_matplotlib(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # `sys.modules[name] = None` makes every `import matplotlib` raise ImportError, as on a machine
    # where the simulate extra was not installed.
    code = (
        "import sys; sys.modules['matplotlib'] = None; from hami.cli import main; "
        f"sys.exit(main({['simulate', '--generate', '6,40', *args]!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


def test_simulate_runs_without_matplotlib(tmp_path):
    done = _hami_without_matplotlib(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "capacity taken" in done.stdout and done.stderr == ""


def test_a_report_without_matplotlib_is_one_clear_line_before_the_replay(tmp_path):
    done = _hami_without_matplotlib(tmp_path, "--report", str(tmp_path / "r"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "hami: error: --report writes PNG plots with matplotlib, which is not installed; "
        "install the simulate extra: pip install -e '.[simulate]' (or pip install matplotlib)\n"
    )
    assert not (tmp_path / "r").exists()


def test_simulate_without_numpy_is_one_clear_line(tmp_path):
    code = "import sys; sys.modules['numpy'] = None; from hami.cli import main; sys.exit(main(['simulate']))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "hami: error: hami simulate needs numpy, which is not installed; install the simulate extra: "
        "pip install -e '.[simulate]'\n"
    )

"""The by-hand walk through the legacy path (docs/testing.md, "Try the whole legacy path by hand") works.

The doc's shell blocks are the steps of `scripts/walkthrough.sh`, verbatim: a test compares them, so the
doc cannot drift from the script. The script itself is run once (real processes: the in-memory API
server, the device plugin with fake cards, the webhook, the extender, and a kubelet-side gRPC Allocate)
and checked twice: the key outputs by value (the filter's node, the bind, the pod's annotations before
and after Allocate, the Allocate answer's env), and every output line the doc shows is found, in order,
in the real output of its step.

Doc markup: ``<!-- walkthrough: NAME -->`` before a fenced block that must equal step NAME of the script,
``<!-- walkthrough-output: NAME -->`` before a fenced block of output lines of step NAME. In an output
block a line ``...`` stands for any number of lines, and ``...`` inside a line for any text (a uid, a
timestamp, the scratch directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ci import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "walkthrough.sh"
DOC = ROOT / "docs" / "testing.md"
#: The ports the doc shows (the script's defaults); the run uses free ones and maps them back.
DOC_PORTS = {"API_PORT": 18080, "WEBHOOK_PORT": 18443, "EXTENDER_PORT": 18888}
#: Generous: the run takes about 15 s on an idle 2-core machine, four Python servers start one by one.
RUN_TIMEOUT_S = 180

_STEP = re.compile(r"step ([a-z][a-z-]*)")
_MARK = re.compile(r"<!-- walkthrough(-output)?: ([a-z][a-z-]*) -->")
_OUT = re.compile(r"==> ([a-z][a-z-]*)")


def _trim(lines: list[str]) -> str:
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def script_steps() -> dict[str, str]:
    """Step name -> its lines (between its ``step NAME`` line and the next one), in script order."""
    steps: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in SCRIPT.read_text().splitlines():
        m = _STEP.fullmatch(line)
        if m:
            assert m[1] not in steps, f"step {m[1]} twice in {SCRIPT.name}"
            current = steps[m[1]] = []
        elif current is not None:
            current.append(line)
    return {name: _trim(lines) for name, lines in steps.items()}


@dataclass(frozen=True)
class DocBlock:
    kind: str  # "step" or "output"
    name: str
    text: str


def doc_blocks() -> list[DocBlock]:
    """Every marked fenced block of docs/testing.md, in document order."""
    lines = DOC.read_text().splitlines()
    blocks: list[DocBlock] = []
    i = 0
    while i < len(lines):
        m = _MARK.fullmatch(lines[i].strip())
        i += 1
        if not m:
            continue
        assert i < len(lines) and lines[i].startswith("```"), f"no fenced block right after {m[0]}"
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        assert end is not None, f"unclosed block after {m[0]}"
        kind = "output" if m[1] else "step"
        blocks.append(DocBlock(kind, m[2], _trim(lines[i + 1 : end])))
        i = end + 1
    return blocks


def test_the_doc_shows_every_step_of_the_script_verbatim_and_in_order():
    steps = script_steps()
    shown = [b for b in doc_blocks() if b.kind == "step"]
    assert [b.name for b in shown] == list(steps), "the doc's step blocks must be the script's, in order"
    for block in shown:
        assert block.text == steps[block.name], (
            f"docs/testing.md block {block.name!r} differs from the script"
        )


def test_every_output_block_belongs_to_a_step_that_comes_before_it():
    seen: set[str] = set()
    outputs = 0
    for block in doc_blocks():
        if block.kind == "step":
            seen.add(block.name)
        else:
            outputs += 1
            assert block.name in seen, f"output block {block.name!r} comes before its step (or has none)"
    assert outputs >= 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Run:
    rc: int
    stdout: str
    stderr: str
    logs: str
    by_step: dict[str, list[str]]

    def explain(self) -> str:
        return (
            f"rc={self.rc}\n--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-4000:]}\n{self.logs}"
        )


@pytest.fixture(scope="module")
def run() -> Run:
    if shutil.which("curl") is None:
        skip_or_fail("the walkthrough's steps use curl, which is not installed")
    # A short base directory: the device plugin's unix socket path must stay under 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="hwt", dir="/tmp"))
    ports = {name: _free_port() for name in DOC_PORTS}
    env = {**os.environ, "TMPDIR": str(base), **{k: str(v) for k, v in ports.items()}}
    # `python` and the console scripts of the interpreter running the tests, as in the venv a user has on.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends the servers it started too
    )
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate()
        err += f"\n(killed after {RUN_TIMEOUT_S} s)"
    logs = "".join(f"--- {p.name}\n{p.read_text()[-3000:]}\n" for p in sorted(base.glob("*/*.log")))
    shutil.rmtree(base, ignore_errors=True)
    # Back to what the doc shows: its ports, and /tmp for the scratch directory's parent.
    for name, port in ports.items():
        out = out.replace(f"127.0.0.1:{port}", f"127.0.0.1:{DOC_PORTS[name]}")
    out = out.replace(f"{base}/", "/tmp/")
    by_step: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        m = _OUT.fullmatch(line)
        if m:
            current = by_step[m[1]] = []
        else:
            current.append(line)
    return Run(proc.returncode, out, err, logs, by_step)


def test_the_script_runs_every_step(run: Run):
    assert run.rc == 0, run.explain()
    assert list(run.by_step) == list(script_steps()), run.explain()


def _json_after(lines: list[str], start: str) -> dict:
    """The JSON value printed from the line that starts with `start` on (as json.dumps(indent) prints)."""
    i = next(i for i, line in enumerate(lines) if line.startswith(start))
    text = "\n".join(lines[i:])
    return json.JSONDecoder().raw_decode(text)[0]


def test_the_legacy_path_gives_the_pod_its_card_and_limits(run: Run):
    assert run.rc == 0, run.explain()
    s = run.by_step
    register = json.loads(_json_after(s["device-plugin"], "{")["hami.io/node-nvidia-register"])
    assert [(c["id"], c["count"], c["devmem"]) for c in register] == [
        ("GPU-aaaa", 10, 81920),
        ("GPU-bbbb", 10, 81920),
    ]
    answer = json.loads(s["review"][0])["response"]
    assert (answer["allowed"], answer["patchType"]) == (True, "JSONPatch")
    patch = _json_after(s["pod"], "[")
    assert {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"} in patch
    assert {
        "op": "replace",
        "path": "/spec/containers/0/resources/limits/nvidia.com~1gpumem",
        "value": "3072",
    } in patch
    filtered = json.loads(s["filter"][0])
    assert (filtered["NodeNames"], filtered["FailedNodes"], filtered["Error"]) == (["gpu-node-1"], {}, "")
    placed = _json_after(s["filter"][1:], "{")
    assert placed["hami.io/vgpu-node"] == "gpu-node-1"
    assert placed["hami.io/vgpu-devices-to-allocate"] == "GPU-aaaa,NVIDIA,3072,30:;"
    assert json.loads(s["bind"][0]) == {"Error": ""}
    bound = _json_after(s["bind"][1:], "{")
    assert bound["hami.io/bind-phase"] == "allocating"
    assert any(
        re.fullmatch(r' "hami.io/mutex.lock": "[^,]+,default,cuda-demo",?', line) for line in s["bind"]
    )
    # The lock's stamp names the pod's UID (and digests its allocation) for the device plugin.
    stamp = ' "hami.io/mutex.lock-allocation": "{\\"uid\\":'
    assert any(line.startswith(stamp) for line in s["bind"]), s["bind"]
    env = dict(line[4:].split("=", 1) for line in s["kubelet"] if line.startswith("env "))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3072m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    after = _json_after(s["after"], "{")
    assert after["hami.io/bind-phase"] == "success"
    assert after["hami.io/vgpu-devices-to-allocate"] == ";"
    assert after["hami.io/vgpu-devices-allocated"] == "GPU-aaaa,NVIDIA,3072,30:;"
    assert "['hami.io/node-handshake', 'hami.io/node-nvidia-register']" in s["after"]  # the node lock is gone


def _matches(expected: str, lines: list[str]) -> str | None:
    """None when the output block `expected` is found in `lines` (see the module docstring), else why not."""
    chunks: list[list[re.Pattern[str]]] = [[]]
    for line in expected.splitlines():
        if line == "...":
            chunks.append([])
        else:
            chunks[-1].append(re.compile(".*".join(re.escape(part) for part in line.split("..."))))
    pos = 0
    for chunk in filter(None, chunks):
        for start in range(pos, len(lines) - len(chunk) + 1):
            if all(p.fullmatch(lines[start + k]) for k, p in enumerate(chunk)):
                pos = start + len(chunk)
                break
        else:
            return f"not found in order: {chunk[0].pattern} ... ({len(chunk)} line(s))"
    return None


def test_every_output_line_the_doc_shows_is_in_the_real_output(run: Run):
    assert run.rc == 0, run.explain()
    for block in doc_blocks():
        if block.kind == "output":
            why = _matches(block.text, run.by_step[block.name])
            assert why is None, f"docs/testing.md output of step {block.name!r}: {why}\n" + "\n".join(
                run.by_step[block.name]
            )


@pytest.mark.parametrize(
    ("expected", "found"),
    [
        ("a\nb", True),
        ("a\n...\nc", True),
        ("a\nc", False),  # adjacent in the doc means adjacent in the output
        ("c\na", False),  # order counts
        ("x...z", True),
        ("b...", True),
        ("d", False),
    ],
    ids=["adjacent", "gap", "not-adjacent", "out-of-order", "wildcard", "trailing-wildcard", "absent"],
)
def test_output_excerpt_matching(expected: str, found: bool):
    assert (_matches(expected, ["a", "b", "c", "xyz"]) is None) is found

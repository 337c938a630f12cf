"""`hami inspect` / `hami explain` / `kubectl-hami` against the in-memory API server seeded with the demo
cluster (kubefakes.demo_cluster): golden table and JSON outputs, JSON values checked against the pods'
annotations, `--usage` against a local monitor and Prometheus, colour rules, and the command as a
process, including its errors (unreachable API server, 403, missing pod: one line, distinct statuses).

Regenerate the goldens after a deliberate change with
``UPDATE_GOLDEN=1 python -m pytest tests/integration/test_tools_cli.py``.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami import annotations as A
from hami import cli
from hami.registration import decode_node_devices_json
from hami.tools import command
from hami.tools.table import Style, use_color
from kubefakes.apiserver import FakeApiServer, write_kubeconfig
from kubefakes.demo_cluster import DEMO_NOW, demo_objects
from tests.golden_text import GOLDEN as GOLDEN_ROOT
from tests.golden_text import check_golden

GOLDEN = GOLDEN_ROOT / "tools"
NOW = "2026-05-04T10:00:00Z"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(fake_apiserver: FakeApiServer) -> FakeApiServer:
    for obj in demo_objects(DEMO_NOW):
        fake_apiserver.store.create_any(obj)
    return fake_apiserver


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _golden(name: str, text: str) -> None:
    check_golden("tools", name, text)


@pytest.mark.parametrize("fmt", ["table", "wide", "json"])
def test_inspect_golden(
    demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    code, out, err = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", fmt)
    assert (code, err) == (0, "")
    _golden(f"inspect-{fmt}.{'json' if fmt == 'json' else 'txt'}", out)


@pytest.mark.parametrize("fmt", ["table", "wide"])
def test_inspect_colour_golden(
    demo: FakeApiServer,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
) -> None:
    # On a terminal: the header bold, states coloured, and the columns aligned by what shows (the
    # colour codes take no column).
    monkeypatch.setattr(command, "_style", lambda stream: Style(True))
    code, out, err = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", fmt)
    assert (code, err) == (0, "") and "\x1b[1m" in out
    _golden(f"inspect-{fmt}-colour.txt", out)


@pytest.mark.parametrize("pod", ["default/whole-card", "default/big-pair", "team-a/etl-2", "infer/chat-0"])
def test_explain_golden(
    demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str], pod: str
) -> None:
    code, out, err = _main(capsys, "explain", pod, "--kubeconfig", kubeconfig, "--now", NOW)
    assert (code, err) == (0, "")
    _golden(f"explain-{pod.replace('/', '-')}.txt", out)


def test_explain_colour_golden(
    demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command, "_style", lambda stream: Style(True))
    code, out, err = _main(capsys, "explain", "infer/chat-0", "--kubeconfig", kubeconfig, "--now", NOW)
    assert (code, err) == (0, "") and "OTHER NODE" in out and "\x1b[1m" in out
    _golden("explain-infer-chat-0-colour.txt", out)


def test_inspect_json_matches_the_annotations(
    demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json")
    assert code == 0
    data = json.loads(out)
    store = demo.store
    want: dict[tuple[str, str, str, str], tuple[int, int]] = {}
    for p in store.list("pods"):
        meta = p["metadata"]
        raw = meta.get("annotations", {}).get(A.NVIDIA_ALLOCATED)
        if not raw or p["status"].get("phase") == "Succeeded":
            continue
        names = [c["name"] for c in p["spec"]["containers"]]
        for name, cds in zip(names, A.decode_pod_devices(raw), strict=True):
            for cd in cds:
                want[(meta["namespace"], meta["name"], name, cd.uuid)] = (cd.usedmem, cd.usedcores)
    got = {}
    for n in data["nodes"]:
        assert n["cardCount"] == len(n["cards"])
        assert n["memory"]["allocatedMiB"] == sum(c["memory"]["allocatedMiB"] for c in n["cards"])
        for c in n["cards"]:
            assert c["memory"]["allocatedMiB"] == sum(x["memoryMiB"] for x in c["containers"])
            assert c["slots"]["used"] == len(c["containers"])
            for x in c["containers"]:
                got[(x["namespace"], x["pod"], x["container"], c["uuid"])] = (x["memoryMiB"], x["cores"])
    assert got == want
    nodes = {n["name"]: n for n in data["nodes"]}
    registered = {n["metadata"]["name"]: decode_node_devices_json(n["metadata"]["annotations"][A.NVIDIA_REGISTER])
                  for n in store.list("nodes") if A.NVIDIA_REGISTER in n["metadata"]["annotations"]}  # fmt: skip
    for name, devices in registered.items():
        assert [
            (c["uuid"], c["memory"]["totalMiB"], c["slots"]["total"], c["health"])
            for c in nodes[name]["cards"]
        ] == [(d.uuid, d.devmem, d.count, d.health) for d in devices]
    assert nodes["gpu-a100-2"]["lock"] == {
        "holder": "infer/chat-2",
        "since": "2026-05-04T09:57:50Z",
        "ageSeconds": 130.0,
        "expired": False,
    }
    assert [c["cordoned"] for c in nodes["gpu-a100-1"]["cards"]] == [False, False, False, True]
    assert nodes["gpu-v100-2"]["cordoned"] is True and nodes["gpu-v100-2"]["usable"] is False
    assert "nvidia.com/gpu: 0" in nodes["gpu-t4-2"]["problem"]
    assert nodes["cpu-1"]["cardCount"] == 0 and nodes["cpu-1"]["usable"] is False
    assert data["quotas"] == [
        {"namespace": "team-a", "resource": "nvidia.com/gpumem", "used": 16000, "limit": 24000}
    ]
    t4 = next(m for m in data["models"] if m["model"] == "NVIDIA-Tesla T4")
    assert (t4["cards"], t4["freeCards"], t4["fragmentedCards"]) == (2, 0, 1)
    assert data["pendingPods"] == 5


def test_yaml_is_the_json(demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, j, _ = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json")
    _, y, _ = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "yaml")
    assert yaml.safe_load(y) == json.loads(j)


def test_named_nodes_list_their_cards_and_unknown_nodes_are_not_found(
    demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(capsys, "inspect", "gpu-t4-1", "--kubeconfig", kubeconfig, "--now", NOW)
    assert code == 0
    assert "default/notebook-2" in out and "gpu-a100-1" not in out
    code, out, err = _main(capsys, "inspect", "gpu-nope", "--kubeconfig", kubeconfig)
    assert (code, out) == (command.EXIT_NOT_FOUND, "")
    assert err == "hami: error: node 'gpu-nope' not found\n"


# -- --usage ------------------------------------------------------------------------------------------

METRICS = """# HELP hami_vgpu_memory_used_bytes vGPU device memory used by a container, bytes
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{namespace="default",pod="notebook-0",container="lab",vdevice_index="0",device_uuid="GPU-t4-1-0",zone="vGPU"} 2147483648
hami_vgpu_memory_used_bytes{namespace="default",pod="notebook-1",container="lab",vdevice_index="0",device_uuid="GPU-t4-1-0",zone="vGPU"} 0
# HELP hami_container_device_utilization_ratio SM utilisation of a container on a device, percent (0-100)
# TYPE hami_container_device_utilization_ratio gauge
hami_container_device_utilization_ratio{namespace="default",pod="notebook-0",container="lab",vdevice_index="0",device_uuid="GPU-t4-1-0",zone="vGPU"} 35
hami_container_device_utilization_ratio{namespace="default",pod="notebook-1",container="lab",vdevice_index="0",device_uuid="GPU-t4-1-0",zone="vGPU"} 0
"""


@pytest.fixture
def monitor() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server: /gpu-t4-1/metrics the monitor text, /api/v1/query Prometheus answers."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            if self.path == "/gpu-t4-1/metrics":
                body, ctype = METRICS.encode(), "text/plain; version=0.0.4"
            elif self.path.startswith("/api/v1/query"):
                name = (
                    "hami_vgpu_memory_used_bytes"
                    if "memory" in self.path
                    else "hami_container_device_utilization_ratio"
                )
                result = []
                for line in METRICS.splitlines():
                    if line.startswith(name + "{"):
                        labels, value = line[len(name) + 1 :].rsplit("} ", 1)
                        metric = dict(kv.split("=", 1) for kv in labels.split(","))
                        result.append(
                            {"metric": {k: v.strip('"') for k, v in metric.items()}, "value": [0, value]}
                        )
                body = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": result}}
                ).encode()
                ctype = "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _t4_containers(out: str) -> dict[str, dict[str, Any]]:
    data = json.loads(out)
    (node,) = [n for n in data["nodes"] if n["name"] == "gpu-t4-1"]
    return {x["pod"]: x for x in node["cards"][0]["containers"]}


def test_usage_from_each_monitor(demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str],
                                 monitor: tuple[str, list[str]]) -> None:  # fmt: skip
    url, seen = monitor
    code, out, err = _main(capsys, "inspect", "gpu-t4-1", "--kubeconfig", kubeconfig, "--now", NOW, "--usage",
                           "--monitor-url", url + "/{node}/metrics", "-o", "json")  # fmt: skip
    assert (code, err) == (0, "")
    assert seen == ["/gpu-t4-1/metrics"]
    xs = _t4_containers(out)
    assert (xs["notebook-0"]["usedMiB"], xs["notebook-0"]["utilization"], xs["notebook-0"]["idle"]) == (
        2048,
        35.0,
        False,
    )
    assert (xs["notebook-1"]["usedMiB"], xs["notebook-1"]["idle"]) == (0, True)
    assert (xs["notebook-2"]["usedMiB"], xs["notebook-2"]["idle"]) == (
        None,
        None,
    )  # the monitor did not report it
    code, out, _ = _main(capsys, "inspect", "gpu-t4-1", "--kubeconfig", kubeconfig, "--now", NOW, "--usage",
                         "--monitor-url", url + "/{node}/metrics")  # fmt: skip
    row = next(line for line in out.splitlines() if "default/notebook-1" in line)
    assert row.split()[-3:] == ["0", "0", "idle"]


def test_usage_from_prometheus(demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str],
                               monitor: tuple[str, list[str]]) -> None:  # fmt: skip
    url, _ = monitor
    code, out, err = _main(
        capsys, "inspect", "gpu-t4-1", "--kubeconfig", kubeconfig, "--prometheus", url, "-o", "json"
    )
    assert (code, err) == (0, "")
    xs = _t4_containers(out)
    assert (xs["notebook-0"]["usedMiB"], xs["notebook-1"]["idle"]) == (2048, True)


def test_a_silent_monitor_is_one_warning(demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str],
                                         monitor: tuple[str, list[str]]) -> None:  # fmt: skip
    url, _ = monitor
    code, out, err = _main(capsys, "inspect", "gpu-v100-1", "--kubeconfig", kubeconfig, "--usage",
                           "--monitor-url", url + "/{node}/metrics")  # fmt: skip
    assert code == 0 and "train/resnet-0" in out
    assert err.count("\n") == 1 and err.startswith("hami: warning: monitor of node gpu-v100-1 at ")


# -- colour -------------------------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    assert use_color(_Tty(), {}) is True
    assert use_color(_Tty(), {"NO_COLOR": ""}) is False
    assert use_color(_Tty(), {"TERM": "dumb"}) is False
    assert use_color(io.StringIO(), {}) is False
    assert Style(True).bad("x") == "\x1b[31mx\x1b[0m" and Style(False).bad("x") == "x"


# -- as a process -------------------------------------------------------------------------------------


def _run(
    *argv: str, module: str = "hami.cli", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, **(env or {})}
    e.pop("HAMI_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT, env=e
    )


def test_process_and_kubectl_plugin(demo: FakeApiServer, kubeconfig: str) -> None:
    r = _run("inspect", "--now", NOW, env={"KUBECONFIG": kubeconfig})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (GOLDEN / "inspect-table.txt").read_text(encoding="utf-8")
    assert "\x1b[" not in r.stdout  # a pipe gets no colour
    # kubectl's flags: a bare pod name in -n's namespace.
    r = _run(
        "explain",
        "t4-pair",
        "-n",
        "default",
        "--kubeconfig",
        kubeconfig,
        "--now",
        NOW,
        module="hami.tools.kubectl",
    )
    assert r.returncode == 0, r.stderr
    assert "1 node: 1/1 NodeInsufficientDevice: needs 2 distinct cards, node has 1" in r.stdout
    setup = (ROOT / "setup.cfg").read_text(encoding="utf-8")
    assert "kubectl-hami = hami.tools.kubectl:main" in setup


def _one_line_error(r: subprocess.CompletedProcess[str], code: int, starts: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(starts), r.stderr


def test_process_errors(demo: FakeApiServer, kubeconfig: str, tmp_path: Path) -> None:
    _one_line_error(_run("explain", "default/nope", "--kubeconfig", kubeconfig), command.EXIT_NOT_FOUND,
                    "hami: error: pod default/nope not found")  # fmt: skip
    demo.faults.add(verb="list", resource="pods", status=403, message='pods is forbidden: User "dev" cannot list '
                    'resource "pods" in API group "" at the cluster scope', times=10)  # fmt: skip
    r = _run("inspect", "--kubeconfig", kubeconfig)
    _one_line_error(r, command.EXIT_FORBIDDEN, "hami: error: ")
    assert "forbidden" in r.stderr and "get/list on nodes, pods and resourcequotas" in r.stderr
    demo.faults.clear()
    dead = write_kubeconfig("http://127.0.0.1:9", str(tmp_path / "dead"))
    r = _run("inspect", "--kubeconfig", dead, "--request-timeout", "2")
    _one_line_error(r, command.EXIT_UNREACHABLE, "hami: error: ")
    assert "cannot reach the API server" in r.stderr
    _one_line_error(
        _run("inspect", "--kubeconfig", str(tmp_path / "missing")),
        command.EXIT_USAGE,
        "hami: error: kubeconfig",
    )
    _one_line_error(
        _run("inspect", "-o", "xml"), command.EXIT_USAGE, "hami inspect: argument -o/--output: invalid choice"
    )
    _one_line_error(_run("explain", "x", "--now", "yesterday", "--kubeconfig", kubeconfig), command.EXIT_USAGE,
                    "hami: error: --now 'yesterday'")  # fmt: skip


# -- the documented schemas ---------------------------------------------------------------------------


def _schema(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "docs" / "schemas" / name).read_text(encoding="utf-8"))


def test_json_outputs_follow_the_documented_schemas(demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str],
                                                    monitor: tuple[str, list[str]]) -> None:  # fmt: skip
    import jsonschema

    url, _ = monitor
    for extra in ([], ["--usage", "--monitor-url", url + "/{node}/metrics"]):
        code, out, _ = _main(
            capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json", *extra
        )
        assert code == 0
        jsonschema.validate(json.loads(out), _schema("inspect.schema.json"))
    pods = [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in demo_objects(DEMO_NOW)
        if p["kind"] == "Pod"
    ]
    statuses = set()
    for ref in pods:
        code, out, _ = _main(capsys, "explain", ref, "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json")
        assert code == 0
        data = json.loads(out)
        jsonschema.validate(data, _schema("explain.schema.json"))
        assert sum(g["count"] for g in data["groups"]) in (0, data["nodes"])
        statuses.add(data["status"])
    assert statuses == {"pending", "scheduled", "finished"}


def test_operations_doc_examples_are_current() -> None:
    """Every transcript in docs/operations.md is what its command prints (scripts/gen_operations_doc.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen_operations_doc", ROOT / "scripts" / "gen_operations_doc.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert page.count("<!-- example: ") >= 8
    assert gen.render(page) == page, "docs/operations.md is stale: run python scripts/gen_operations_doc.py"


def test_device_config_is_the_schedulers(demo: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:  # fmt: skip
    """With the scheduler's device-config the tools read resources as the extender does: here the count
    resource is renamed, so the demo's `nvidia.com/gpu` pod asks for no managed device."""
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text("nvidia:\n  resourceCountName: example.com/vgpu\n", encoding="utf-8")
    code, out, _ = _main(capsys, "explain", "default/whole-card", "--kubeconfig", kubeconfig, "--device-config",
                         str(cfg), "-o", "json")  # fmt: skip
    assert code == 0 and json.loads(out)["status"] == "no-devices"
    cfg.write_text("bogus: 1\n", encoding="utf-8")
    code, out, err = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--device-config", str(cfg))
    assert (code, out) == (command.EXIT_USAGE, "")
    assert err.startswith(f"hami: error: {cfg}: bogus: unknown top-level key")

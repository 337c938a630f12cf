"""`hami-scheduler-extender` / `python -m scheduler_extender`: flags, environment precedence, the real
process serving against the in-memory API server, clean stop, and refusing to start on bad input."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kubefakes.apiserver import FakeApiServer
from scheduler_extender.cli import duration, parse_args
from tests.builders import cards, gpu_node

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "seconds"), [("300", 300.0), ("5m", 300.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


def test_bad_duration_names_the_valid_forms() -> None:
    with pytest.raises(Exception, match=r"'5 minutes' is not a duration; valid: 300, 300s, 5m, 1m30s, 500ms"):
        duration("5 minutes")


def test_flag_beats_environment_beats_default() -> None:
    env = {"HAMI_EXTENDER_PORT": "9999", "HAMI_EXTENDER_NODE_LOCK_TIMEOUT": "2m", "KUBECONFIG": "/k",
           "HAMI_EXTENDER_LEADER_ELECT": "true", "POD_NAME": "sched-0", "POD_NAMESPACE": "hami"}  # fmt: skip
    args = parse_args(["--port", "7000"], env=env)
    assert args.port == 7000
    assert args.node_lock_timeout == 120.0
    assert args.leader_elect is True
    assert args.kubeconfig == "/k"
    assert (args.leader_elect_identity, args.leader_elect_resource_namespace) == ("sched-0", "hami")
    defaults = parse_args([], env={})
    assert (defaults.port, defaults.node_lock_timeout, defaults.leader_elect, defaults.kubeconfig) == (
        8888,
        300.0,
        False,
        None,
    )
    assert defaults.leader_elect_resource_namespace == "kube-system"


def test_tls_flags_go_together(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as e:
        parse_args(["--tls-cert-file", "c.pem"], env={})
    assert e.value.code == 2
    assert "--tls-cert-file and --tls-private-key-file go together" in capsys.readouterr().err


def test_the_process_serves_and_stops_cleanly(fake_apiserver: FakeApiServer) -> None:
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 2)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_extender", "--kubeconfig", str(fake_apiserver.kubeconfig_path),
         "--address", "127.0.0.1", "--port", "0", "--scheduler-name", "my-sched"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            m = re.search(
                r"serving on http://127\.0\.0\.1:(\d+) .*scheduler 'my-sched', leader election off", line
            )
            if m:
                port = int(m.group(1))
                break
        assert port is not None
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz") as r:
                    assert r.status == 200 and r.read() == b"ok\n"
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_config_refuses_to_start(fake_apiserver: FakeApiServer, tmp_path: Path) -> None:
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text("nvidia:\n  deviceSplitCount: zero\n")
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_extender", "--kubeconfig", str(fake_apiserver.kubeconfig_path),
         "--port", "0", "--config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"cannot start: {cfg}: nvidia.deviceSplitCount: 'zero' must be an integer" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("level", "sends", "warnings_only"), [("all", True, False), ("failures", True, True),
                                                                ("none", False, False)], ids=["all", "failures", "none"])  # fmt: skip
def test_events_flag_reaches_the_event_sink(
    fake_apiserver: FakeApiServer, level: str, sends: bool, warnings_only: bool
) -> None:
    from scheduler_extender.cli import Server

    server = Server(
        parse_args(["--kubeconfig", str(fake_apiserver.kubeconfig_path), "--events", level], env={})
    )
    try:
        assert (server.events._send is not None, server.events.warnings_only) == (sends, warnings_only)
    finally:
        server.client.close()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_gc_freezer_freezes_survivors_and_full_pass_refreezes() -> None:
    import gc
    import weakref

    from scheduler_extender.gctune import GcFreezer

    keep = [{"pod": i} for i in range(1000)]  # long-lived objects, like the watch caches
    try:
        GcFreezer.tick()
        assert gc.get_freeze_count() >= len(keep)
        cycle = _Cycle()
        alive = weakref.ref(cycle)
        GcFreezer.tick()  # the cycle is now old and frozen ...
        del cycle
        GcFreezer.tick()
        assert alive() is not None  # ... so young collections and freezing keep it
        GcFreezer.full()
        assert alive() is None  # the full pass looked at everything and froze the survivors again
        assert gc.get_freeze_count() >= len(keep)
    finally:
        gc.unfreeze()
    with pytest.raises(ValueError, match="want 0 < interval_s <= full_interval_s, got 10 and 5"):
        GcFreezer(10, 5)


def test_gc_flags_are_checked(capsys) -> None:  # type: ignore[no-untyped-def]
    assert (parse_args([], env={}).gc_freeze_interval, parse_args([], env={}).gc_full_interval) == (
        10.0,
        3600.0,
    )
    assert parse_args(["--gc-freeze-interval", "0"], env={}).gc_freeze_interval == 0
    with pytest.raises(SystemExit):
        parse_args(["--gc-freeze-interval", "2h"], env={})
    assert "--gc-freeze-interval 7200s / --gc-full-interval 3600s: want 0 (off)" in capsys.readouterr().err

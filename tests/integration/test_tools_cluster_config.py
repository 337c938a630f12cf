"""`hami inspect`, `hami explain` and `hami simulate --from-cluster` read the scheduler's device config from
the cluster (the chart's ConfigMap) unless a file is given, and show an expired node lock as expired.

Against the in-memory API server: the demo cluster plus one Ascend 910B3 node and an NPU pod, with the
chart's ConfigMap switching Ascend on (`scheduler.enableAscend`, what `devices.ascend.enabled` renders).
"""

from __future__ import annotations

import json
from datetime import UTC, timedelta

import pytest

from hami import annotations as A
from hami import cli
from hami.tools import command
from kubefakes.apiserver import FakeApiServer
from kubefakes.demo_cluster import DEMO_NOW, DEVICE_CONFIG, demo_objects, device_configmap
from tests.vendor_fleet import ASCEND_910B3

NOW = "2026-05-04T10:00:00Z"
ASCEND_ON = DEVICE_CONFIG.replace("enableAscend: false", "enableAscend: true")
NPU_POD = {
    "kind": "Pod",
    "metadata": {"name": "npu-job", "namespace": "default", "uid": "uid-npu-job"},
    "spec": {
        "schedulerName": "hami-scheduler",
        "containers": [{"name": "main", "resources": {"limits": {
            "huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16384"}}}],
    },
    "status": {"phase": "Pending"},
}  # fmt: skip


def _ascend_node(now=DEMO_NOW) -> dict:
    stamp = now.astimezone(UTC).replace(tzinfo=None) - timedelta(seconds=20)
    res = {"cpu": "192", "memory": "1Ti", "pods": "110", "huawei.com/Ascend910B3": "2"}
    return {
        "kind": "Node",
        "metadata": {
            "name": "npu-1",
            "labels": {"kubernetes.io/hostname": "npu-1", "ascend": "on"},
            "annotations": {
                "hami.io/node-register-Ascend910B3": ASCEND_910B3,
                "hami.io/node-handshake-Ascend910B3": A.encode_handshake(A.HANDSHAKE_REPORTED, stamp),
            },
        },
        "status": {"capacity": res, "allocatable": res, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
def cluster(fake_apiserver: FakeApiServer) -> FakeApiServer:
    for obj in demo_objects(DEMO_NOW):
        if obj["kind"] == "ConfigMap":
            obj = device_configmap(ASCEND_ON)
        fake_apiserver.store.create_any(obj)
    fake_apiserver.store.create_any(_ascend_node())
    fake_apiserver.store.create_any(NPU_POD)
    return fake_apiserver


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _npu_node(out: str) -> dict:
    return next(n for n in json.loads(out)["nodes"] if n["name"] == "npu-1")


def test_inspect_reads_the_charts_configmap(cluster: FakeApiServer, kubeconfig: str, capsys) -> None:
    code, out, err = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json")
    assert (code, err) == (0, "")
    npu = _npu_node(out)
    assert npu["problem"] is None and npu["cardCount"] == 2 and npu["vendors"] == ["Ascend910B3"]


def test_without_the_configmap_the_defaults_stand_in_with_a_warning(
    cluster: FakeApiServer, kubeconfig: str, capsys
) -> None:
    cluster.store.delete("configmaps", "hami-scheduler-device", namespace="hami-system")
    code, out, err = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json")
    assert code == 0 and "warning: no device ConfigMap found" in err
    assert _npu_node(out)["cardCount"] == 0, "Ascend is off in HAMi's defaults: the node's NPUs are not read"


def test_a_release_elsewhere_is_found_by_the_charts_label(
    cluster: FakeApiServer, kubeconfig: str, capsys
) -> None:
    cluster.store.delete("configmaps", "hami-scheduler-device", namespace="hami-system")
    cm = device_configmap(ASCEND_ON, namespace="gpu")
    cm["metadata"]["name"] = "gpu-hami-scheduler-device"
    cluster.store.create_any({"kind": "Namespace", "metadata": {"name": "gpu"}})
    cluster.store.create_any(cm)
    code, out, err = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json")
    assert (code, err) == (0, "") and _npu_node(out)["cardCount"] == 2


def test_explain_sees_an_npu_pod_as_a_device_pod(
    cluster: FakeApiServer, kubeconfig: str, capsys, tmp_path
) -> None:
    code, out, err = _main(
        capsys, "explain", "default/npu-job", "--kubeconfig", kubeconfig, "--now", NOW, "-o", "json"
    )
    assert (code, err) == (0, "")
    assert json.loads(out)["status"] != "no-devices"
    # With HAMi's defaults (a file without Ascend) the same pod asks for nothing the scheduler manages.
    defaults = tmp_path / "device-config.yaml"
    defaults.write_text(DEVICE_CONFIG, encoding="utf-8")
    code, out, _ = _main(capsys, "explain", "default/npu-job", "--kubeconfig", kubeconfig, "--now", NOW,
                         "-o", "json", "--device-config", str(defaults))  # fmt: skip
    assert code == 0 and json.loads(out)["status"] == "no-devices"


def test_a_named_configmap_must_exist_and_hold_a_device_config(
    cluster: FakeApiServer, kubeconfig: str, capsys
) -> None:
    code, out, err = _main(
        capsys, "inspect", "--kubeconfig", kubeconfig, "--device-configmap", "hami-system/nope"
    )
    assert (code, out) == (command.EXIT_NOT_FOUND, "")
    assert err == "hami: error: configmap hami-system/nope not found (--device-configmap)\n"
    code, _, err = _main(capsys, "inspect", "--kubeconfig", kubeconfig, "--device-configmap", "nope")
    assert code == command.EXIT_USAGE and "want NAMESPACE/NAME" in err
    bad = device_configmap("bogus: 1\n", namespace="hami-system")
    bad["metadata"]["name"] = "bad"
    cluster.store.create_any(bad)
    code, _, err = _main(
        capsys, "inspect", "--kubeconfig", kubeconfig, "--device-configmap", "hami-system/bad"
    )
    assert code == command.EXIT_USAGE
    assert err.startswith(
        "hami: error: configmap hami-system/bad device-config.yaml: bogus: unknown top-level key"
    )


def test_simulate_from_cluster_keeps_the_npus(cluster: FakeApiServer, kubeconfig: str, capsys) -> None:
    code, out, err = _main(
        capsys, "simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--json", "--seed", "2"
    )
    assert code == 0, err
    with_config = json.loads(out)
    cluster.store.delete("configmaps", "hami-scheduler-device", namespace="hami-system")
    code, out, err = _main(
        capsys, "simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--json", "--seed", "2"
    )
    assert code == 0 and "warning: no device ConfigMap found" in err
    # The demo's 18 NVIDIA cards, and the Ascend node's 2 NPUs only with the scheduler's config.
    assert (with_config["gpus"], json.loads(out)["gpus"]) == (20, 18)


@pytest.mark.parametrize(
    ("argv", "expired"),
    [(("--now", NOW), False), (("--now", "2026-05-04T10:04:00Z"), True), (("--now", NOW, "--node-lock-timeout", "2m"), True)],
    ids=["130s-of-5m", "370s-of-5m", "130s-of-2m"],
)  # fmt: skip
def test_an_expired_node_lock_is_shown_expired(
    cluster: FakeApiServer, kubeconfig: str, capsys, argv: tuple, expired: bool
) -> None:
    # gpu-a100-2's lock was taken at 09:57:50 by infer/chat-2, which is being bound.
    code, out, _ = _main(capsys, "inspect", "gpu-a100-2", "--kubeconfig", kubeconfig, *argv, "-o", "json")
    assert code == 0 and json.loads(out)["nodes"][0]["lock"]["expired"] is expired
    code, out, _ = _main(capsys, "inspect", "gpu-a100-2", "--kubeconfig", kubeconfig, *argv)
    assert ("lock of infer/chat-2 expired" in out) is expired and (
        "locked by infer/chat-2" in out
    ) is not expired
    code, out, _ = _main(capsys, "explain", "default/big-pair", "--kubeconfig", kubeconfig, *argv)
    assert code == 0
    if expired:
        assert "gpu-a100-2: node lock of infer/chat-2 expired" in out and "the next bind takes it over" in out
        assert "binds to it wait" not in out
    else:
        assert "gpu-a100-2: node lock held by infer/chat-2 for 2m10s (binds to it wait)" in out

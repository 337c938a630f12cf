"""The chart's MIG and MPS parts: HAMi's default MIG profile allow-list in the device config (as HAMi
v2.10's chart writes it), devicePlugin.migStrategy (HAMi's key) reaching the device plugin through the
device config, and the device plugin pod sharing the host's IPC namespace (/dev/shm) where a node runs
`operatingmode: mps`, as its MPS daemons and their clients must."""

from __future__ import annotations

import helm_python
import pytest
import yaml

from hami.config import load_config
from hami.vendors import nvidia_mig
from tests.chart.render import render
from tests.chart.schemas import validate

# HAMi v2.10's chart (templates/scheduler/device-configmap.yaml), in its order.
HAMI_ALLOWLIST = [
    (["A30"], ["1g.6gb", "2g.12gb", "4g.24gb"]),
    (["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"], ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]),
    (["A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"], ["1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"]),
    (["H100-PCIE-80GB", "H100-SXM5-80GB"], ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]),
    (["H100-PCIE-94GB", "H100-SXM5-94GB"], ["1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb"]),
    (["H20", "H100 on GH200"], ["1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"]),
    (["H200 NVL", "H200-SXM5"], ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]),
    (["B200"], ["1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb"]),
    (["RTX PRO 6000 Blackwell Server Edition"], ["1g.24gb", "2g.48gb", "4g.96gb"]),
]


def device_config(r) -> dict:
    return yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])


def pod_spec(r) -> dict:
    return r.one("DaemonSet", "hami-device-plugin")["spec"]["template"]["spec"]


def test_hamis_default_mig_allowlist_is_written_and_loads() -> None:
    cfg = device_config(render())
    written = [(e["models"], e["profiles"]) for e in cfg["nvidia"]["migProfileAllowlist"]]
    assert written == HAMI_ALLOWLIST
    loaded = load_config(cfg).nvidia.migProfileAllowlist
    a100 = nvidia_mig.allowed_profiles("NVIDIA A100-SXM4-40GB", loaded)
    assert a100 == ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")


def test_an_own_allowlist_replaces_hamis() -> None:
    own = [{"models": ["A100-SXM4-40GB"], "profiles": ["3g.20gb"]}]
    cfg = device_config(render({"devices": {"nvidia": {"migProfileAllowlist": own}}}))
    assert cfg["nvidia"]["migProfileAllowlist"] == own
    assert device_config(render({"devices": {"nvidia": {"migProfileAllowlist": []}}}))["nvidia"].get(
        "migProfileAllowlist"
    ) in (None, [])
    with pytest.raises(helm_python.HelmValuesError, match="/devices/nvidia/migProfileAllowlist/0"):
        render({"devices": {"nvidia": {"migProfileAllowlist": [{"models": ["A30"], "profiles": ["6gb"]}]}}})


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_hamis_mig_strategy_reaches_the_device_config(strategy: str) -> None:
    cfg = device_config(render({"devicePlugin": {"migStrategy": strategy}}))
    assert cfg["nvidia"]["migStrategy"] == strategy
    assert load_config(cfg).nvidia.migStrategy == strategy  # what the device plugin reads


def test_a_bad_mig_strategy_is_refused_naming_the_key() -> None:
    with pytest.raises(helm_python.HelmValuesError) as e:
        render({"devicePlugin": {"migStrategy": "all"}})
    assert "at '/devicePlugin/migStrategy'" in str(e.value), str(e.value)


@pytest.mark.parametrize(
    ("values", "ipc"),
    [
        ({}, False),
        ({"devicePlugin": {"nodeconfig": [{"name": "n1", "operatingmode": "hami-core"}]}}, False),
        ({"devicePlugin": {"nodeconfig": [{"name": "n1"}, {"name": "n2", "operatingmode": "mps"}]}}, True),
        ({"devicePlugin": {"nodeconfig": [{"name": "n2", "operatingMode": "mps"}]}}, True),  # any case, as HAMi
        ({"devicePlugin": {"hostIPC": True}}, True),
        ({"device-config": {"content": "nvidia:\n  operatingMode: mps\n"}}, True),
        ({"device-config": {"content": 'nodeconfig:\n  - {"name": "n1", "operatingmode": "mps"}\n'}}, True),
        ({"device-config": {"content": "nvidia:\n  operatingMode: hami-core\n"}}, False),
    ],
    ids=["default", "hami-core-node", "mps-node", "mps-node-camel", "forced", "content-all", "content-node",
         "content-hami-core"],
)  # fmt: skip
def test_the_plugin_shares_the_hosts_ipc_where_a_node_runs_mps(values: dict, ipc: bool) -> None:
    r = render(values)
    assert pod_spec(r).get("hostIPC", False) is ipc
    validate(r.one("DaemonSet", "hami-device-plugin"), "v1.30.0")


def test_the_documented_mps_pod_is_valid_and_shares_the_hosts_ipc() -> None:
    from tests.chart.render import ROOT

    doc = (ROOT / "docs" / "device-plugin.md").read_text()
    section = doc.split("### `mps`")[1].split("\n## ")[0]
    pod = yaml.safe_load(section.split("```yaml\n")[1].split("```")[0])
    validate(pod, "v1.30.0")
    assert pod["spec"]["hostIPC"] is True and pod["metadata"]["annotations"]["nvidia.com/vgpu-mode"] == "mps"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1

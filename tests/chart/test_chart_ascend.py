"""Ascend end to end through the chart: devices.ascend.enabled writes the vnpus section HAMi's
ascend-device-plugin and the scheduler read (HAMi's chips and templates unless the values give their
own, in HAMi's current or older list form), the values HAMi's chart has for Ascend arrive, and the
walk-through of docs/install.md ("Ascend NPUs") renders and sends its NPU pod to our scheduler."""

from __future__ import annotations

import dataclasses

import yaml

from hami.config import load_config
from hami.vendors import build_vendors
from tests.chart.render import ROOT, render
from tests.chart.test_chart_render import _cel

DOC = (ROOT / "docs" / "install.md").read_text()
SECTION = DOC.split("## Ascend NPUs")[1].split("\n## ")[0]


def device_config(r) -> dict:
    return yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])


def _ascend(cfg) -> dict:
    return {k: v for k, v in build_vendors(cfg).items() if k.startswith("Ascend")}


def _same_chip(v) -> tuple:
    # The resource names resolved (a chip may leave them "" for the defaults), the rest as parsed.
    chip = dataclasses.replace(v.chip, resourceName="", resourceMemoryName="", resourceCoreName="")
    return v.resource_names(), chip


def test_the_charts_chips_are_the_schedulers_defaults() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "hami" / "files" / "ascend-vnpus.yaml").read_text())
    on = {"scheduler": {"enableAscend": True}}
    written = _ascend(load_config({**on, "vnpus": chart}))
    builtin = _ascend(load_config(on))
    assert list(written) == list(builtin) and len(written) == 7
    assert {k: _same_chip(v) for k, v in written.items()} == {k: _same_chip(v) for k, v in builtin.items()}


def test_enabled_ascend_writes_every_chip_with_its_templates() -> None:
    cfg = device_config(render({"devices": {"ascend": {"enabled": True}}}))
    assert cfg["scheduler"]["enableAscend"] is True
    chips = {c["commonWord"]: c for c in cfg["vnpus"]["configs"]}
    assert [t["name"] for t in chips["Ascend910B3"]["templates"]] == ["vir05_1c_16g", "vir10_3c_32g"]
    assert chips["Ascend910B3"]["resourceMemoryName"] == "huawei.com/Ascend910B3-memory"
    assert set(_ascend(load_config(cfg))) == set(chips)
    # Off: no section, no chips (HAMi's --enable-ascend off).
    assert "vnpus" not in device_config(render())


def test_hamis_ascend_values_arrive() -> None:
    cfg = device_config(
        render({"devices": {"ascend": {"enabled": True, "hamiVnpuCore": True, "runtimeClassName": "ascend"}}})
    )
    loaded = load_config(cfg)
    assert loaded.section("vnpus").hamiVnpuCore is True
    assert {v.chip.runtimeClassName for v in _ascend(loaded).values()} == {"ascend"}


def test_own_chips_replace_the_charts_in_either_form() -> None:
    chip = {"chipName": "910B3", "commonWord": "Ascend910B3", "memoryAllocatable": 65536, "aiCore": 20,
            "templates": [{"name": "vir10_3c_32g", "memory": 32768, "aiCore": 10}]}  # fmt: skip
    for config in ([chip], {"hamiVnpuCore": False, "configs": [chip]}):
        cfg = device_config(render({"devices": {"ascend": {"enabled": True, "deviceConfig": config}}}))
        assert list(_ascend(load_config(cfg))) == ["Ascend910B3"], config


def test_the_install_walkthrough_renders_and_routes_its_npu_pod() -> None:
    values = yaml.safe_load(SECTION.split("```yaml\n")[1].split("```")[0])
    pod = yaml.safe_load(SECTION.split("```yaml\n")[2].split("```")[0])
    for needed in ("kubectl label node", "ascend=on", "ascend-device-plugin.yaml", "ascend-runtimeclass.yaml",
                   "hami-device-node-config", "namespace: hami-system", "hami\\.io/node-register-Ascend910B3"):  # fmt: skip
        assert needed in SECTION, needed
    r = render(values, kube_version="v1.30.0")
    cfg = load_config(device_config(r))
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    managed = {
        m["name"]
        for m in yaml.safe_load(r.one("ConfigMap", "hami-scheduler")["data"]["config.yaml"])["extenders"][0][
            "managedResources"
        ]
    }
    assert set(limits) <= managed, set(limits) - managed
    assert "Ascend910B3" in _ascend(cfg)
    [w] = r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert _cel(w["matchConditions"][0]["expression"], pod), "the webhook must see the NPU pod"
    # ascend-device-plugin's Allocate-time patches are allowed without a value of the operator's.
    assert "allocationWriters" not in SECTION.split("```yaml\n")[1].split("```")[0]
    args = r.one("Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any(a.startswith("--allocation-writers=") and "hami-system:hami-ascend" in a for a in args)

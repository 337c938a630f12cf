"""Ascend: one vendor per chip, vNPU templates in the webhook, hami-core mode, 910C modules, JSON annotation."""

import json

import pytest

from hami.config import DeviceConfig, load_config
from hami.errors import ConfigError, InvalidRequest
from hami.vendors import build_vendors
from tests.vendor_fleet import ASCEND_910B3, CONFIG, container, fleet, node, place, pod

VENDORS = build_vendors(CONFIG)
B3 = VENDORS["Ascend910B3"]
NODE = fleet()["Ascend910B3"]
CHART = [
    "Ascend910A",
    "Ascend910B2",
    "Ascend910B3",
    "Ascend910B4-1",
    "Ascend910B4",
    "Ascend310P",
    "Ascend910C",
]


def test_every_chart_chip_when_enabled_only():
    assert [v for v in VENDORS if v.startswith("Ascend")] == CHART
    assert not any(v.startswith("Ascend") for v in build_vendors(DeviceConfig()))


def test_config_section_parses_chips_and_templates():
    cfg = load_config({"scheduler": {"enableAscend": True}, "vnpus": {"hamiVnpuCore": True, "configs": [
        {"commonWord": "Ascend910X", "memoryAllocatable": 1000, "templates": [{"name": "b", "memory": 600}, {"name": "a", "memory": 300}]}
    ]}})  # fmt: skip
    v = build_vendors(cfg)["Ascend910X"]
    assert [t.name for t in v.chip.templates] == ["a", "b"]
    assert v.resource_names().memory == "huawei.com/Ascend910X-memory"
    with pytest.raises(ConfigError, match=r"^vnpus\.configs\[0\]\.templates\[0\]\.mem: unknown key"):
        load_config(
            {"vnpus": {"configs": [{"commonWord": "A", "memoryAllocatable": 1, "templates": [{"mem": 1}]}]}}
        )


def test_hamis_older_list_form_of_vnpus_is_the_list_of_chips():
    # HAMi up to v2.9 read `vnpus:` as the list of chips (no hamiVnpuCore); its docs still show it.
    chips = [{"chipName": "910X", "commonWord": "Ascend910X", "memoryAllocatable": 1000,
              "templates": [{"name": "vir01", "memory": 500, "aiCore": 1}]}]  # fmt: skip
    listed = load_config({"scheduler": {"enableAscend": True}, "vnpus": chips})
    mapped = load_config({"scheduler": {"enableAscend": True}, "vnpus": {"configs": chips}})
    assert listed == mapped
    assert [v for v in build_vendors(listed) if v.startswith("Ascend")] == ["Ascend910X"]
    assert listed.section("vnpus").hamiVnpuCore is False
    with pytest.raises(ConfigError, match=r"^vnpus\[0\]\.templates\[0\]\.mem: unknown key"):
        load_config({"vnpus": [{"commonWord": "A", "memoryAllocatable": 1, "templates": [{"mem": 1}]}]})
    with pytest.raises(ConfigError, match=r"^vnpus: must be a mapping with hamiVnpuCore and configs, or"):
        load_config({"vnpus": "Ascend910B3"})


@pytest.mark.parametrize(
    ("chip", "message"),
    [
        ({"templates": [{"memory": 16384, "aiCore": 5}]},
         r"^vnpus\.configs\[0\]\.templates\[0\]\.name: must not be empty; valid: a vNPU template name"),
        ({"templates": [{"name": "t", "memory": -16384}]},
         r"^vnpus\.configs\[0\]\.templates\[0\]\.memory: -16384 is invalid; valid: MiB > 0$"),
        ({"templates": [{"name": "t", "memory": 0}]},
         r"^vnpus\.configs\[0\]\.templates\[0\]\.memory: 0 is invalid; valid: MiB > 0$"),
        ({"templates": [{"name": "t", "memory": 100, "aiCore": -5}]},
         r"^vnpus\.configs\[0\]\.templates\[0\]\.aiCore: -5 is invalid; valid: an integer >= 0$"),
        ({"aiCore": -1}, r"^vnpus\.configs\[0\]\.aiCore: -1 is invalid; valid: an integer >= 0$"),
        ({"memoryCapacity": -1}, r"^vnpus\.configs\[0\]\.memoryCapacity: -1 is invalid; valid: an integer >= 0$"),
    ],
    ids=["nameless-template", "negative-template", "empty-template", "negative-template-cores", "negative-cores",
         "negative-capacity"],
)  # fmt: skip
def test_config_rejects_templates_the_plugin_would_read_otherwise(chip, message):
    entry = {"commonWord": "Ascend910X", "memoryAllocatable": 65536, **chip}
    with pytest.raises(ConfigError, match=message):
        load_config({"scheduler": {"enableAscend": True}, "vnpus": {"configs": [entry]}})


@pytest.mark.parametrize(
    ("asked", "written"),
    [("12000", "16384"), ("40000", "65536"), (None, "65536")],
    ids=["template", "whole", "absent"],
)
def test_webhook_rounds_memory_up_to_a_template(asked, written):
    limits = {"huawei.com/Ascend910B3": 1}
    if asked:
        limits["huawei.com/Ascend910B3-memory"] = asked
    c = container("c", limits)
    assert B3.mutate_container(c, pod={}).uses_device
    assert c["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == written
    assert c["resources"]["requests"]["huawei.com/Ascend910B3-memory"] == written


@pytest.mark.parametrize(("vendor", "limits", "annos", "message"), [
    ("Ascend910B3", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 70000}, {}, "huawei.com/Ascend910B3-memory 70000 is invalid"),
    ("Ascend910B3", {"huawei.com/Ascend910B3": 2, "huawei.com/Ascend910B3-memory": 16384}, {}, "vNPU not supported for multiple devices"),
    ("Ascend910B3", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-core": 20}, {}, "only supported in hami-core"),
    ("Ascend910C", {"huawei.com/Ascend910C": 3}, {}, "Ascend910C device request must be 1 or 2\\*n, got 3"),
    ("Ascend910C", {"huawei.com/Ascend910C": 1, "huawei.com/Ascend910C-memory": 16384}, {}, "vNPU not supported for multiple devices"),
], ids=["beyond-card", "multi-vnpu", "core-hard-mode", "910c-odd", "910c-vnpu-after-rounding"])  # fmt: skip
def test_webhook_rejections(vendor, limits, annos, message):
    with pytest.raises(InvalidRequest, match=message):
        VENDORS[vendor].mutate_container(container("c", limits), pod={"metadata": {"annotations": annos}})


def test_cores_without_soft_mode_say_how_to_get_it():
    c = container("c", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-core": 30})
    with pytest.raises(InvalidRequest) as e:
        B3.mutate_container(c, pod={})
    message = str(e.value)
    assert "only supported in hami-core (soft split) mode" in message
    assert "huawei.com/vnpu-mode: hami-core" in message and "hami-vnpu-core" in message, message
    # With the annotation the same container is accepted (the node must run the soft split).
    c = container("c", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-core": 30})
    soft = {"metadata": {"annotations": {"huawei.com/vnpu-mode": "hami-core"}}}
    assert B3.mutate_container(c, pod=soft).uses_device


def test_910c_one_becomes_a_module_of_two():
    c = container("c", {"huawei.com/Ascend910C": 1})
    VENDORS["Ascend910C"].mutate_container(c, pod={})
    assert c["resources"]["limits"]["huawei.com/Ascend910C"] == "2"


def test_filter_hard_split_worked_example():
    p = pod(
        "p",
        container("c", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 16384}),
        annotations={"hami.io/use-Ascend910B3-uuid": "ascend-7a2c-1"},
    )
    a = place(p, NODE, now=1_700_000_000.9).annotations
    assert a["hami.io/Ascend910B3-devices-to-allocate"] == "ascend-7a2c-1,Ascend910B3,16384,0:;"
    assert a["huawei.com/Ascend910B3"] == '[{"UUID":"ascend-7a2c-1","temp":"vir05_1c_16g","memory":16384}]'
    assert a["predicate-time"] == "1700000000"


def test_hami_core_needs_a_soft_node_and_writes_memory_and_core():
    limits = {
        "huawei.com/Ascend910B3": 1,
        "huawei.com/Ascend910B3-memory": 15360,
        "huawei.com/Ascend910B3-core": 20,
    }
    annos = {"huawei.com/vnpu-mode": "hami-core", "hami.io/use-Ascend910B3-uuid": "ascend-7a2c-1"}
    hard = place(pod("p", container("c", limits), annotations=annos), NODE)
    assert hard.failed_nodes["npu-a"] == "1/2 ModeNotFit"
    soft_reg = ASCEND_910B3.replace('"devcore":20', '"devcore":100')
    soft = node(
        "npu-s", annotations={"hami.io/node-register-Ascend910B3": soft_reg, "hami-vnpu-core": "true"}
    )
    a = place(pod("q", container("c", limits), annotations=annos), soft).annotations
    assert a["huawei.com/Ascend910B3"] == '[{"UUID":"ascend-7a2c-1","memory":15360,"core":20}]'


def test_b4_request_never_lands_on_b4_1_cards():
    reg = ASCEND_910B3.replace("Ascend910B3", "Ascend910B4-1")
    other = node("npu-b41", annotations={"hami.io/node-register-Ascend910B4-1": reg})
    out = place(pod("p", container("c", {"huawei.com/Ascend910B4": 1})), other)
    assert out.node is None and out.failed_nodes["npu-b41"] == "NodeInsufficientDevice: no Ascend910B4 device"


def test_910c_without_a_whole_module_free_says_why():
    # Chips 0 and 2 are free but in different modules (1 and 3 are not registered): HAMi refuses with
    # AllocatedCardsInsufficientRequest, never with an empty reason.
    reg = json.dumps([{"id": f"c-{i}", "index": i, "count": 1, "devmem": 65536, "devcore": 20, "type": "Ascend910C", "health": True}
                      for i in (0, 2)])  # fmt: skip
    n = node("c2", annotations={"hami.io/node-register-Ascend910C": reg})
    from tests.vendor_fleet import state

    out = state(n).filter(pod("a", container("c", {"huawei.com/Ascend910C": 2})), ["c2"])
    assert out.node is None
    assert out.failed_nodes["c2"] == "2/2 AllocatedCardsInsufficientRequest"


def test_910c_takes_whole_modules():
    reg = json.dumps([{"id": f"c-{i}", "index": i, "count": 1, "devmem": 65536, "devcore": 20, "type": "Ascend910C", "health": True}
                      for i in range(4)])  # fmt: skip
    n = node("c1", annotations={"hami.io/node-register-Ascend910C": reg})
    from tests.vendor_fleet import state

    st = state(n)
    first = st.filter(pod("a", container("c", {"huawei.com/Ascend910C": 2})), ["c1"])
    assert (
        first.annotations["hami.io/Ascend910C-devices-allocated"]
        == "c-0,Ascend910C,65536,0:c-1,Ascend910C,65536,0:;"
    )
    second = st.filter(pod("b", container("c", {"huawei.com/Ascend910C": 2})), ["c1"])
    assert (
        second.annotations["hami.io/Ascend910C-devices-allocated"]
        == "c-2,Ascend910C,65536,0:c-3,Ascend910C,65536,0:;"
    )

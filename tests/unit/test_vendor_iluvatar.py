"""Iluvatar: one vendor per chip, colon registration, webhook vCore rewrite and SOL_CONTINER_NAME."""

from hami.config import DeviceConfig, load_config
from hami.vendors import build_vendors
from tests.vendor_fleet import CONFIG, container, fleet, place, pod

VENDORS = build_vendors(CONFIG)
ILU = VENDORS["BI-V150"]
NODE = fleet()["BI-V150"]


def test_enabled_only_by_the_switch_one_vendor_per_chip():
    assert not {"MR-V100", "BI-V150"} & set(build_vendors(DeviceConfig()))
    assert {"MR-V100", "MR-V50", "BI-V150", "BI-V100"} <= set(VENDORS)
    cfg = load_config({"scheduler": {"enableIluvatar": True}, "iluvatars": [{"chipName": "BI-V200"}]})
    v = build_vendors(cfg)["BI-V200"]
    assert v.resource_names().count == "iluvatar.ai/BI-V200-vgpu"
    assert (v.register_key, v.handshake_key) == (
        "hami.io/node-BI-V200-register",
        "hami.io/node-handshake-BI-V200",
    )


def test_request_units_and_default_cores():
    r = ILU.container_request(container("c", {"iluvatar.ai/BI-V150-vgpu": 1, "iluvatar.ai/BI-V150.vMem": 64}))
    assert (r.nums, r.memreq, r.coresreq) == (1, 16384, 0)  # cores default 0: compute is shared


def test_webhook_adds_the_container_name_env_and_whole_cards_for_several():
    c = container("train", {"iluvatar.ai/BI-V150-vgpu": 3, "iluvatar.ai/BI-V150.vCore": 20})
    assert ILU.mutate_container(c, pod={}).uses_device
    assert c["env"] == [{"name": "SOL_CONTINER_NAME", "value": "train"}]
    assert c["resources"]["limits"]["iluvatar.ai/BI-V150.vCore"] == "300"


def test_filter_worked_example():
    p = pod(
        "p",
        container(
            "train",
            {"iluvatar.ai/BI-V150-vgpu": 1, "iluvatar.ai/BI-V150.vMem": 64, "iluvatar.ai/BI-V150.vCore": 50},
        ),
        annotations={"hami.io/use-BI-V150-uuid": "GPU-7c1f02aa-0002"},
    )
    a = place(p, NODE).annotations
    assert a["hami.io/BI-V150-devices-to-allocate"] == "GPU-7c1f02aa-0002,BI-V150,16384,50:;"
    assert a["hami.io/BI-V150-devices-allocated"] == "GPU-7c1f02aa-0002,BI-V150,16384,50:;"
    assert ILU.uses_node_lock


def test_several_cards_clamp_cores_per_card():
    p = pod("p", container("c", {"iluvatar.ai/BI-V150-vgpu": 2, "iluvatar.ai/BI-V150.vCore": 200}))
    a = place(p, NODE).annotations
    assert (
        a["hami.io/BI-V150-devices-allocated"]
        == "GPU-7c1f02aa-0001,BI-V150,32768,100:GPU-7c1f02aa-0002,BI-V150,32768,100:;"
    )

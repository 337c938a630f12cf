"""MetaX: whole GPUs from capacity with the same-card rule; sGPU JSON inventory, GiB units, QoS."""

import json

import pytest

from hami.errors import InvalidRequest
from hami.vendors.metax import MetaxGPUVendor, MetaxSGPUVendor, sgpu_memory_mib
from tests.vendor_fleet import container, fleet, node, place, pod, state

GPU, SGPU = MetaxGPUVendor(), MetaxSGPUVendor()
GNODE, SNODE = fleet()["Metax-GPU"], fleet()["Metax-SGPU"]


def test_whole_gpu_inventory_and_request():
    devs = GPU.node_devices(GNODE)
    assert [d.uuid for d in devs][:2] == ["mx-a-metax-0", "mx-a-metax-1"] and len(devs) == 8
    assert {(d.count, d.devmem, d.devcore) for d in devs} == {(1, 65536, 100)}
    r = GPU.container_request(container("c", {"metax-tech.com/gpu": 2}))
    assert (r.nums, r.memreq, r.mem_percentage, r.coresreq) == (2, 0, 100, 100)


def test_whole_gpu_two_cards_and_containers_only_share_one_card():
    a = place(pod("p", container("c", {"metax-tech.com/gpu": 2})), GNODE).annotations
    assert (
        a["hami.io/metax-gpu-devices-to-allocate"]
        == "mx-a-metax-0,Metax-GPU,65536,100:mx-a-metax-1,Metax-GPU,65536,100:;"
    )
    # Two containers: the second may only use the first one's card, which has one slot.
    two = pod("q", container("a", {"metax-tech.com/gpu": 1}), container("b", {"metax-tech.com/gpu": 1}))
    out = place(two, GNODE)
    assert out.node is None
    assert out.failed_nodes["mx-a"] == "1/8 CardTimeSlicingExhausted, 7/8 CardNotFoundCustomFilterRule"


@pytest.mark.parametrize(("value", "mib"), [("8", 8192), ("8Gi", 8192), ("1024Mi", 1024), ("8G", 7629)])
def test_sgpu_memory_units(value, mib):
    assert sgpu_memory_mib(value, resource="m") == mib


def test_sgpu_inventory_and_filter_worked_example():
    (d,) = SGPU.node_devices(SNODE)
    assert (d.uuid, d.count, d.devmem, d.devcore, d.qos, d.link_zone) == (
        "GPU-9a1b77c0",
        16,
        65536,
        100,
        "best-effort",
        1,
    )
    p = pod(
        "p",
        container("c", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 30, "metax-tech.com/vmemory": 8}),
        annotations={"metax-tech.com/sgpu-qos-policy": "best-effort"},
    )
    a = place(p, SNODE, now=1_700_000_000.25).annotations
    assert a["hami.io/metax-sgpu-devices-to-allocate"] == "GPU-9a1b77c0,Metax-SGPU,8192,30:;"
    assert a["metax-tech.com/gpu-devices-allocated"] == '[[{"uuid":"GPU-9a1b77c0","compute":30,"vRam":8192}]]'
    assert a["metax-tech.com/predicate-time"] == "1700000000250000000"


def test_sgpu_qos_mismatch_on_a_used_card():
    st = state(SNODE)
    first = pod("a", container("c", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 10}))
    assert st.filter(first, ["mxs-a"]).node == "mxs-a"
    other = pod(
        "b",
        container("c", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 10}),
        annotations={"metax-tech.com/sgpu-qos-policy": "fixed-share"},
    )
    assert st.filter(other, ["mxs-a"]).failed_nodes["mxs-a"] == "1/1 CardQosPolicyMismatch"


def test_sgpu_unhealthy_card_and_padding_of_the_json():
    bad = node(
        "mxs-b",
        annotations={
            "metax-tech.com/node-gpu-devices": SNODE["metadata"]["annotations"][
                "metax-tech.com/node-gpu-devices"
            ].replace('"healthy":true', '"healthy":false')
        },
    )
    out = place(pod("p", container("c", {"metax-tech.com/sgpu": 1})), bad)
    assert out.failed_nodes["mxs-b"] == "1/1 CardUnhealthy"
    two = pod(
        "q",
        container("a", {}),
        container("b", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 20, "metax-tech.com/vmemory": 1}),
    )
    assert json.loads(place(two, SNODE).annotations["metax-tech.com/gpu-devices-allocated"]) == [
        [],
        [{"uuid": "GPU-9a1b77c0", "compute": 20, "vRam": 1024}],
    ]


def test_sgpu_webhook_qos_and_app_class():
    p = {"metadata": {}}
    c = container("c", {"metax-tech.com/sgpu": 1})
    assert SGPU.mutate_container(c, pod=p).uses_device
    assert p["metadata"]["annotations"]["metax-tech.com/sgpu-qos-policy"] == "best-effort"
    with pytest.raises(InvalidRequest, match=r"must be set one of \[best-effort, fixed-share, burst-share\]"):
        SGPU.mutate_container(
            c, pod={"metadata": {"annotations": {"metax-tech.com/sgpu-qos-policy": "gold"}}}
        )
    with pytest.raises(InvalidRequest, match=r"must be set one of \[online, offline\]"):
        SGPU.mutate_container(
            c, pod={"metadata": {"annotations": {"metax-tech.com/sgpu-app-class": "batch"}}}
        )
    two = container("c", {"metax-tech.com/sgpu": 2})
    with pytest.raises(InvalidRequest, match="app-class pod must request single device"):
        SGPU.mutate_container(
            two, pod={"metadata": {"annotations": {"metax-tech.com/sgpu-app-class": "online"}}}
        )


def test_malformed_sgpu_inventory_marks_the_node_unusable():
    why = state().upsert_node(node("bad", annotations={"metax-tech.com/node-gpu-devices": '[{"uuid": 3}]'}))
    assert why == "metax-tech.com/node-gpu-devices: device 0: must be an object with a non-empty 'uuid'"

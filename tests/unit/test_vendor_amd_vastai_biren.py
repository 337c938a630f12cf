"""AMD (CU percentages, limits only), Vastai (dies of one card together) and Biren (whole cards)."""

import pytest

from hami.errors import InvalidRequest
from hami.vendors.amd import AMDVendor
from hami.vendors.biren import BirenVendor
from hami.vendors.vastai import VastaiVendor
from tests.vendor_fleet import container, fleet, node, place, pod, state

AMD, VA, BR = AMDVendor(), VastaiVendor(), BirenVendor()
FLEET = fleet()


def test_amd_worked_example():
    (d,) = AMD.node_devices(FLEET["AMD"])
    assert (d.uuid, d.count, d.devmem, d.devcore, d.type) == (
        "8eff74b5-0000-1000-801b-b56457addd1b",
        10,
        196288,
        304,
        "AMD Instinct MI300X VF",
    )
    p = pod("p", container("c", {"amd.com/gpu": 1, "amd.com/gpumem": 49152, "amd.com/gpucores": 25}))
    a = place(p, FLEET["AMD"]).annotations
    assert (
        a["hami.io/amd-devices-to-allocate"]
        == "8eff74b5-0000-1000-801b-b56457addd1b,AMD Instinct MI300X VF,49152,76:;"
    )
    assert a["hami.io/amd-devices-allocated"] == a["hami.io/amd-devices-to-allocate"]


def test_amd_reads_limits_only_and_defaults_to_the_whole_card():
    only_requests = {"name": "c", "resources": {"requests": {"amd.com/gpu": "1"}}}
    assert AMD.container_request(only_requests) is None
    a = place(pod("p", container("c", {"amd.com/gpu": 1})), FLEET["AMD"]).annotations
    assert (
        a["hami.io/amd-devices-allocated"]
        == "8eff74b5-0000-1000-801b-b56457addd1b,AMD Instinct MI300X VF,196288,304:;"
    )


def test_amd_webhook_and_type_rules():
    with pytest.raises(
        InvalidRequest, match="amd.com/gpucores must be an integer percentage between 1 and 100"
    ):
        AMD.mutate_container(container("c", {"amd.com/gpu": 1, "amd.com/gpucores": 0}), pod={})
    assert AMD.mutate_container(container("c", {"amd.com/gpumem": 1000}), pod={}).uses_device
    p = pod("p", container("c", {"amd.com/gpu": 1}), annotations={"amd.com/nouse-gputype": "mi300x"})
    assert place(p, FLEET["AMD"]).failed_nodes["amd-a"] == "1/1 CardTypeMismatch"


def test_amd_cus_run_out():
    st = state(FLEET["AMD"])
    for i in range(4):
        assert st.filter(
            pod(f"p{i}", container("c", {"amd.com/gpu": 1, "amd.com/gpumem": 1000, "amd.com/gpucores": 25})),
            ["amd-a"],
        ).node
    out = st.filter(
        pod("x", container("c", {"amd.com/gpu": 1, "amd.com/gpumem": 1000, "amd.com/gpucores": 25})),
        ["amd-a"],
    )
    assert out.failed_nodes["amd-a"] == "1/1 CardInsufficientCore"


def test_vastai_dies_of_one_card_stay_together():
    devs = VA.node_devices(FLEET["Vastai"])
    assert [(d.uuid, d.aic, d.strategy, d.devcore) for d in devs][:2] == [
        ("va-3-die0", "va-3", "die", 100),
        ("va-3-die1", "va-3", "die", 100),
    ]
    st = state(FLEET["Vastai"])
    st.filter(pod("one", container("c", {"vastaitech.com/va": 1})), ["va-a"])  # die0 of va-3
    a = st.filter(pod("two", container("c", {"vastaitech.com/va": 2})), ["va-a"]).annotations
    assert a["hami.io/Vastai-devices-to-allocate"] == "va-4-die0,Vastai,0,0:va-4-die1,Vastai,0,0:;"


def test_vastai_mutex_keeps_a_used_card_whole():
    st = state(FLEET["Vastai"])
    st.filter(pod("one", container("c", {"vastaitech.com/va": 1})), ["va-a"])
    m = pod(
        "m", container("c", {"vastaitech.com/va": 1}), annotations={"hami.io/gpu-scheduler-policy": "mutex"}
    )
    assert st.filter(m, ["va-a"]).annotations["hami.io/Vastai-devices-allocated"] == "va-4-die0,Vastai,0,0:;"
    m2 = pod(
        "m2", container("c", {"vastaitech.com/va": 1}), annotations={"hami.io/gpu-scheduler-policy": "mutex"}
    )
    assert (
        st.filter(m2, ["va-a"]).failed_nodes["va-a"]
        == "2/4 CardTimeSlicingExhausted, 2/4 ExclusiveDeviceAllocateConflict"
    )


def test_biren_worked_example_and_exhausted_card():
    st = state(FLEET["Biren"])
    a = st.filter(pod("p", container("c", {"birentech.com/gpu": 1})), ["br-a"]).annotations
    assert a["hami.io/Biren-devices-to-allocate"] == "brgpu-0,Biren,0,0:;"
    assert a["hami.io/Biren-devices-allocated"] == "brgpu-0,Biren,0,0:;"
    assert (
        st.filter(pod("q", container("c", {"birentech.com/gpu": 1})), ["br-a"]).failed_nodes["br-a"]
        == "1/1 CardTimeSlicingExhausted"
    )


@pytest.mark.parametrize(("vendor", "key", "value", "reason"), [
    (AMD, "hami.io/node-amd-register", "{not json", "hami.io/node-amd-register: not valid JSON"),
    (BR, "hami.io/node-biren-register", '[{"count":1}]', "hami.io/node-biren-register: device 0: field 'id' must be a non-empty string"),
    (VA, "hami.io/node-va-register", '[{"id":"v","count":"2"}]', "hami.io/node-va-register: device 0 (v): field 'count' must be an integer >= 0"),
], ids=["amd", "biren", "vastai"])  # fmt: skip
def test_malformed_registration_marks_the_node_unusable(vendor, key, value, reason):
    why = state().upsert_node(node("bad", annotations={key: value}))
    assert why is not None and why.startswith(reason)


def test_json_registration_keys_match_case_insensitively():
    (d,) = BR.node_devices(
        node(
            "b",
            annotations={"hami.io/node-biren-register": '[{"ID":"b0","Count":2,"DevMem":100,"Health":true}]'},
        )
    )
    assert (d.uuid, d.count, d.devmem, d.health) == ("b0", 2, 100, True)


def test_one_card_listed_twice_is_malformed():
    reg = '[{"id":"brgpu-0","count":1,"health":true},{"id":"brgpu-0","count":1,"health":true}]'
    why = state().upsert_node(node("bad", annotations={"hami.io/node-biren-register": reg}))
    assert (
        why
        == "hami.io/node-biren-register: devices 0 and 1 both have id 'brgpu-0'; every card must be listed once"
    )

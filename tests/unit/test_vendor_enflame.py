"""Enflame: whole GCUs from capacity; DRS profiles from the node annotation and the DRS pod annotations."""

import pytest

from hami.errors import InvalidRequest
from hami.vendors.enflame import DRSVendor, GCUVendor
from tests.vendor_fleet import container, fleet, node, place, pod, state

GCU, DRS = GCUVendor(), DRSVendor()
GNODE, ENODE = fleet()["GCU"], fleet()["Enflame"]


def test_gcu_whole_cards_then_exclusive_conflict():
    st = state(GNODE)
    p = lambda n: pod(n, container("c", {"enflame.com/gcu": 1}))  # noqa: E731
    assert (
        st.filter(p("a"), ["g1"]).annotations["hami.io/enflame-gcu-devices-to-allocate"]
        == "g1-GCU-0,GCU,100,100:;"
    )
    assert (
        st.filter(p("b"), ["g1"]).annotations["hami.io/enflame-gcu-devices-allocated"]
        == "g1-GCU-1,GCU,100,100:;"
    )
    assert st.filter(p("c"), ["g1"]).failed_nodes["g1"] == "2/2 ExclusiveDeviceAllocateConflict"


def test_drs_inventory_worked_example():
    devs = DRS.node_devices(ENODE)
    assert [(d.uuid, d.count, d.devmem, d.minor) for d in devs] == [
        ("e1-enflame-drs-0", 6, 49152, "0"),
        ("e1-enflame-drs-1", 6, 49152, "1"),
    ]
    assert [(p.name, p.size, p.mem_gb, p.cores) for p in devs[0].profiles] == [
        ("1g.8gb", 1, 8, 17),
        ("2g.16gb", 2, 16, 34),
        ("3g.24gb", 3, 24, 50),
        ("6g.48gb", 6, 48, 100),
    ]


def test_drs_filter_worked_example():
    p = pod(
        "p",
        container("trainer", {"enflame.com/drs-gcu": 2}),
        annotations={"enflame.com/use-gpuuuid": "e1-enflame-drs-1"},
    )
    a = place(p, ENODE, now=1_700_000_000).annotations
    assert a["hami.io/enflame-vgpu-devices-allocated"] == "e1-enflame-drs-1,Enflame,16384,34:;"
    assert (
        a["enflame.com/gcu-assigned"],
        a["enflame.com/gcu-assigned-index"],
        a["enflame.com/gcu-assigned-id"],
        a["enflame.com/gcu-assigned-minor"],
        a["enflame.com/gcu-request-size"],
    ) == ("false", "1", "1", "1", "2")
    assert (
        a["assigned-containers"]
        == '{"trainer":{"allocated":false,"request":2,"profileID":"1","profileName":"2g.16gb"}}'
    )
    assert a["enflame.com/gcu-assigned-time"] == "1700000000000000000"


def test_drs_memory_and_cores_pick_the_smallest_profile():
    p = pod("p", container("c", {"enflame.com/gcu-memory": 20000, "enflame.com/gcu-core": 30}))
    a = place(p, ENODE).annotations
    assert a["hami.io/enflame-vgpu-devices-allocated"] == "e1-enflame-drs-0,Enflame,24576,50:;"
    none = pod("q", container("c", {"enflame.com/drs-gcu": 5}))
    assert place(none, ENODE).failed_nodes["e1"] == "1/2 ModeNotFit"


def test_drs_profile_with_unreadable_memory_is_not_placed():
    # "1g.xgb": the memory part is not a number (read as 0 GB). HAMi refuses the profile (ModeNotFit)
    # instead of creating a partition with 0 MiB; a readable profile still places.
    reg = '{"devices":[{"index":"0","capacity":6}],"profiles":{"1g.xgb":"0","2g.16gb":"1"}}'
    n = node("e9", annotations={"enflame.com/gcu-drs-capacity": reg})
    out = place(pod("p", container("c", {"enflame.com/drs-gcu": 1})), n)
    assert out.node is None and out.failed_nodes["e9"] == "1/1 ModeNotFit"
    two = place(pod("q", container("c", {"enflame.com/drs-gcu": 2})), n)
    assert two.annotations["hami.io/enflame-vgpu-devices-allocated"] == "e9-enflame-drs-0,Enflame,16384,100:;"


def test_drs_cores_run_out_before_slices():
    st = state(ENODE)
    for i in range(2):
        assert st.filter(pod(f"a{i}", container("c", {"enflame.com/drs-gcu": 3})), ["e1"]).node == "e1"
    for i in range(2):
        assert st.filter(pod(f"b{i}", container("c", {"enflame.com/drs-gcu": 3})), ["e1"]).node == "e1"
    assert (
        st.filter(pod("c", container("c", {"enflame.com/drs-gcu": 1})), ["e1"]).failed_nodes["e1"]
        == "2/2 CardInsufficientMemory"
    )


@pytest.mark.parametrize(("limits", "message"), [
    ({"enflame.com/drs-gcu": 0}, "enflame.com/drs-gcu must be greater than 0"),
    ({"enflame.com/gcu-memory": 0}, "enflame.com/gcu-memory must be greater than 0"),
    ({"enflame.com/gcu-core": 120}, r"enflame.com/gcu-core must be in range \(0,100\]"),
], ids=["size", "memory", "core"])  # fmt: skip
def test_drs_webhook_rejections(limits, message):
    with pytest.raises(InvalidRequest, match=message):
        DRS.mutate_container(container("c", limits), pod={})


def test_drs_webhook_mirrors_limits_into_requests_and_leaves_others_alone():
    c = container("c", {"enflame.com/drs-gcu": 2})
    assert DRS.mutate_container(c, pod={}).uses_device
    assert c["resources"]["requests"] == {"enflame.com/drs-gcu": "2"}
    plain = {"name": "x"}
    assert not DRS.mutate_container(plain, pod={}).uses_device and plain == {"name": "x"}


def test_malformed_drs_capacity_marks_the_node_unusable():
    why = state().upsert_node(
        node(
            "bad",
            annotations={
                "enflame.com/gcu-drs-capacity": '{"devices":[{"index":"0","capacity":-1}],"profiles":{"1g.8gb":"0"}}'
            },
        )
    )
    assert why == "enflame.com/gcu-drs-capacity: devices[0]: capacity -1 must be a number of slices > 0"

"""NVIDIA MIG in the scheduler: profile and placement choice, the wire formats, usage from annotations.

The expected values are HAMi's own worked examples (pkg/device/nvidia mig_*_test.go,
pkg/scheduler/mig_allocation_test.go, pkg/device/devices_test.go) where they exist, so the decisions
and the annotations are the ones HAMi's scheduler writes for the same inputs.
"""

from __future__ import annotations

from collections import Counter

import pytest

from hami import annotations as A
from hami.cluster import ClusterState
from hami.config import load_config
from hami.errors import AnnotationError, ConfigError, InvalidRequest
from hami.fit import NodeView, fit_container, fit_pod
from hami.model import (
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    MigPlacement,
    MigProfile,
    MigSlot,
    Selection,
)
from hami.pods import ContainerKind, ContainerSpec
from hami.reason_words import Reason
from hami.reasons import humanize
from hami.registration import decode_node_devices_json, encode_node_devices_json, mig_profile_to_json
from hami.scoring import CardPolicy, NodePolicy, PolicyChoice
from hami.vendors import build_vendors, nvidia_mig
from hami.vendors.nvidia import NvidiaVendor
from tests.builders import ctr, node, pod

NV = NvidiaVendor()
VENDORS = build_vendors()
SPREAD = PolicyChoice(node=NodePolicy.BINPACK, cards=(CardPolicy.SPREAD,))
P = MigPlacement


def a100_profiles() -> tuple[MigProfile, ...]:
    """HAMi's a100MigProfiles() test fixture (memory and cores as given there)."""
    return (
        MigProfile("1g.5gb", 5120, 14, 1, tuple(P(i, 1) for i in range(7))),
        MigProfile("2g.10gb", 10240, 28, 2, (P(0, 2), P(2, 2), P(4, 2))),
        MigProfile("3g.20gb", 20480, 42, 3, (P(0, 4), P(4, 4))),
    )


def mig_card(uuid: str = "GPU-a", profiles: tuple[MigProfile, ...] | None = None, **kw) -> Device:
    kw = {"index": 0, "count": 7, "devmem": 40960, "devcore": 100, "type": "NVIDIA-A100-SXM4-40GB", **kw}
    return Device(uuid, mode="mig", mig_profiles=a100_profiles() if profiles is None else profiles, **kw)


def req(nums: int = 1, mem: int = 0, pct: int = 101, cores: int = 0) -> ContainerRequest:
    return ContainerRequest("NVIDIA", nums, mem, pct, cores)


def used(*placements: MigPlacement) -> DeviceUsage:
    return DeviceUsage(mig=tuple(placements))


# -- geometry -------------------------------------------------------------------------------------


def test_balanced_packing_puts_small_profiles_high_and_the_others_low():
    """HAMi TestSelectMigPlacementUsesBalancedPacking: 3g -> start 4, 2g -> 0, then 1g -> 3, 1g -> 2."""
    profiles = {p.name: p for p in a100_profiles()}
    occupied: list[MigPlacement] = []
    for name, start in [("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 3), ("1g.5gb", 2)]:
        got = nvidia_mig.free_placement(profiles[name], occupied)
        assert got is not None and got.start == start, (name, got)
        occupied.append(got)


def test_smallest_profile_of_enough_memory_with_a_free_placement():
    profiles = a100_profiles()
    assert nvidia_mig.choose(profiles, (), 10000) == (profiles[1], P(0, 2))
    assert nvidia_mig.choose(profiles, (), 5120) == (profiles[0], P(6, 1))
    # every 2g placement taken: the next size up
    assert nvidia_mig.choose(profiles, (P(0, 2), P(2, 2), P(4, 2)), 10000) is None
    assert nvidia_mig.choose(profiles, (P(0, 2), P(2, 2)), 10000) == (profiles[1], P(4, 2))
    assert nvidia_mig.choose(profiles, (P(6, 1),), 6000)[0].name == "2g.10gb"
    # an explicit profile takes exactly that one
    assert nvidia_mig.choose(profiles, (), 100, only="3g.20gb") == (profiles[2], P(4, 4))
    assert nvidia_mig.choose(profiles, (), 30000, only="3g.20gb") is None


# -- the per-card rules (HAMi's CustomFilterRule and AddResourceUsage) ----------------------------


def test_booking_takes_the_reported_profile_and_placement():
    """HAMi TestAddResourceUsageUsesReportedProfileAndPlacement: 10000 MiB -> 2g.10gb at {0,2},
    booking the profile's 10240 MiB and 28 % (the physical UUID unchanged)."""
    (cd,) = NV.finish_card(
        mig_card(), DeviceUsage(), [ContainerDevice("GPU-a", "NVIDIA", 10000, 0)], Selection()
    )
    assert cd == ContainerDevice("GPU-a", "NVIDIA", 10240, 28, MigSlot("2g.10gb", P(0, 2)))


def test_card_rule_uses_reported_placement_capacity():
    """HAMi TestCustomFilterUsesReportedPlacementCapacity: three 2g instances leave only the 1g at 6."""
    u = used(P(0, 2), P(2, 2), P(4, 2))
    assert (
        NV.card_rule(mig_card(), u, req(mem=10000), 10000, Selection(), ())
        == Reason.CARD_MIG_TOPOLOGY_INFEASIBLE
    )
    assert NV.card_rule(mig_card(), u, req(mem=5000), 5000, Selection(), ()) is None


def test_card_rule_counts_this_containers_devices_on_the_same_card_only():
    """HAMi TestCustomFilterIgnoresQueuedAllocationsForOtherGPUs: a device taken on this card uses its
    last placement; fit_container passes only the devices on the card being checked."""
    u = used(P(0, 2), P(2, 2), P(4, 2))
    taken = [ContainerDevice("GPU-a", "NVIDIA", 5000, 0)]
    assert NV.card_rule(mig_card(), u, req(mem=5000), 5000, Selection(), ()) is None
    assert NV.card_rule(mig_card(), u, req(mem=5000), 5000, Selection(), taken) == "CardMigTopologyInfeasible"


def test_percentage_request_is_placed_by_its_effective_memory():
    """HAMi TestFitUsesEffectivePercentageMemoryForMigPlacement: 25 % of 40960 MiB is 10240 MiB, a 2g
    profile, and only a 1g placement is left."""
    card = mig_card()
    u = DeviceUsage(3, 30720, 0, (P(0, 2), P(2, 2), P(4, 2)))
    got, reasons = fit_container(
        req(pct=25), [card], lambda _: u, vendor=NV, selection=Selection(), policy=SPREAD
    )
    assert got is None
    assert reasons == Counter({Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: 1})


def test_mig_request_only_for_mig_cards_and_matching_pods():
    """HAMi TestIsMIGRequest: a pod naming another mode takes no instances; no annotation or `mig` does."""
    mig, core = mig_card(), Device("GPU-b", 0, 10, 40960, 100, "NVIDIA-A100", mode="hami-core")
    assert NV.card_repeats(mig, Selection())
    assert NV.card_repeats(mig, Selection(mode="mig"))
    assert not NV.card_repeats(mig, Selection(mode="hami-core"))
    assert not NV.card_repeats(core, Selection())


def _single_1g_card(placements: tuple[MigPlacement, ...]) -> Device:
    return mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, placements),), count=7)


def test_one_container_takes_two_instances_of_one_card():
    """HAMi TestFitInDevicesAllowsMultipleMigPlacementsOnSingleGPU: gpu 2 x 4000 MiB on one card."""
    card = _single_1g_card(tuple(P(i, 1) for i in range(7)))
    containers = [ContainerSpec("workload", ContainerKind.APP, (req(nums=2, mem=4000),))]
    f = fit_pod(
        containers, NodeView("n", {"NVIDIA": [card]}, {}), vendors=VENDORS,
        selections={"NVIDIA": Selection(mode="mig")}, policy=SPREAD,
    )  # fmt: skip
    assert f.ok
    (devs,) = f.devices["NVIDIA"]
    assert [d.uuid for d in devs] == ["GPU-a", "GPU-a"]
    assert [d.mig.placement for d in devs] == [P(6, 1), P(5, 1)]
    assert [(d.usedmem, d.usedcores) for d in devs] == [(5120, 14), (5120, 14)]


def test_too_few_placements_fail_with_hamis_reason_text():
    """HAMi TestFitInDevicesRejectsInsufficientMigPlacementsOnSingleGPU: the one placement is taken by
    the first device, the revisit of the card counts one CardMigTopologyInfeasible."""
    card = _single_1g_card((P(6, 1),))
    containers = [ContainerSpec("workload", ContainerKind.APP, (req(nums=2, mem=4000),))]
    f = fit_pod(
        containers, NodeView("n", {"NVIDIA": [card]}, {}), vendors=VENDORS,
        selections={"NVIDIA": Selection(mode="mig")}, policy=SPREAD,
    )  # fmt: skip
    assert not f.ok
    assert f.reason_text() == "1/1 AllocatedCardsInsufficientRequest, 1/1 CardMigTopologyInfeasible"
    assert "without a free placement" in humanize(f.reason_text(), containers)


def test_hami_core_cards_keep_the_distinct_card_count():
    """HAMi TestFitInDevicesRetainsPhysicalCountCheckForNonMigGPU."""
    card = Device("GPU-a", 0, 7, 40960, 100, "NVIDIA-A100", mode="hami-core")
    f = fit_pod(
        [ContainerSpec("workload", ContainerKind.APP, (req(nums=2, mem=4000),))],
        NodeView("n", {"NVIDIA": [card]}, {}), vendors=VENDORS,
        selections={"NVIDIA": Selection(mode="hami-core")}, policy=SPREAD,
    )  # fmt: skip
    assert f.reason_text() == "1/1 NodeInsufficientDevice"


def test_later_containers_see_the_instances_of_earlier_ones():
    card = _single_1g_card((P(5, 1), P(6, 1)))
    containers = [
        ContainerSpec("a", ContainerKind.APP, (req(mem=1000),)),
        ContainerSpec("b", ContainerKind.APP, (req(mem=1000),)),
        ContainerSpec("c", ContainerKind.APP, (req(mem=1000),)),
    ]
    view = NodeView("n", {"NVIDIA": [card]}, {})
    f = fit_pod(containers[:2], view, vendors=VENDORS, selections={}, policy=SPREAD)
    assert [c[0].mig.placement for c in f.devices["NVIDIA"]] == [P(6, 1), P(5, 1)]
    f = fit_pod(containers, view, vendors=VENDORS, selections={}, policy=SPREAD)
    assert f.reason_text() == "1/1 CardMigTopologyInfeasible"


def test_explicit_profile_annotation():
    sel = NV.selection({nvidia_mig.MIG_PROFILE: "3g.20gb"})
    assert sel.mig_profile == "3g.20gb"
    (cd,) = NV.finish_card(mig_card(), DeviceUsage(), [ContainerDevice("GPU-a", "NVIDIA", 100, 0)], sel)
    assert cd.mig == MigSlot("3g.20gb", P(4, 4)) and cd.usedmem == 20480
    assert not NV.type_matches(Device("GPU-b", 0, 10, 40960, 100, "NVIDIA-A100"), sel)
    with pytest.raises(InvalidRequest, match="nvidia.com/mig-profile.*'big'"):
        NV.selection({nvidia_mig.MIG_PROFILE: "big"})


# -- wire formats ---------------------------------------------------------------------------------


def test_mig_profile_registration_wire_format():
    """HAMi TestMigProfileUsesCompactWireFormat (instanceCount is not on the wire)."""
    p = MigProfile("1g.5gb", 4864, 15, 1, (P(6, 1),))
    assert A.go_json(mig_profile_to_json(p)) == (
        '{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}'
    )


def test_registration_with_mig_profiles_decodes_and_encodes_in_hamis_key_order():
    """HAMi TestGetNodeDevices_MigProfilesFromNode: unknown profile keys are ignored."""
    raw = (
        '[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","numa":0,'
        '"health":true,"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,'
        '"instanceCount":7,"multiprocessorCount":14,"placements":[{"start":6,"size":1}]}]}]'
    )
    (d,) = decode_node_devices_json(raw)
    assert d.mode == "mig" and d.mig_profiles == (MigProfile("1g.5gb", 5120, 14, 1, (P(6, 1),)),)
    # Go's DeviceInfo field order: ..., mode, migProfiles, health
    assert encode_node_devices_json([d]) == (
        '[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","mode":"mig",'
        '"migProfiles":[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,'
        '"placements":[{"start":6,"size":1}]}],"health":true}]'
    )
    with pytest.raises(AnnotationError, match=r"migProfiles\[0\].*'name'"):
        decode_node_devices_json('[{"id":"GPU-0","devmem":1,"migProfiles":[{"memoryMB":1}]}]')


def test_allocations_encode_as_hami_writes_them():
    """HAMi TestEncodeDecodeMigAllocations: one 1g.5gb instance at {6,1} on GPU-a."""
    containers = [[ContainerDevice("GPU-a", "NVIDIA", 5120, 14, MigSlot("1g.5gb", P(6, 1)))]]
    raw = A.encode_mig_allocations(A.mig_allocations_of(containers))
    assert raw == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}}]'
    )
    (a,) = A.decode_mig_allocations(raw)
    assert (a.container_index, a.device_index, a.gpu_uuid, a.profile, a.placement) == (
        0,
        0,
        "GPU-a",
        "1g.5gb",
        P(6, 1),
    )
    assert not a.realized


def test_allocations_keep_zero_runtime_ids_and_reject_partial_or_duplicate_entries():
    """HAMi TestDecodeMigAllocationsPreservesZeroRuntimeInstanceIDs / RejectsPartialRuntimeIdentity /
    RejectsDuplicateDeviceIndex."""
    full = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2},'
        '"migUUID":"MIG-a","gpuInstanceID":4,"computeInstanceID":0}]'
    )
    (a,) = A.decode_mig_allocations(full)
    assert (a.gpu_instance_id, a.compute_instance_id, a.realized) == (4, 0, True)
    assert A.encode_mig_allocations([a]) == full
    with pytest.raises(AnnotationError, match="partial runtime identity"):
        A.decode_mig_allocations(
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
            '"placement":{"start":0,"size":2},"migUUID":"MIG-a"}]'
        )
    with pytest.raises(AnnotationError, match="duplicate MIG allocation for container 0 device 0"):
        A.decode_mig_allocations(
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},'
            '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]'
        )
    with pytest.raises(AnnotationError, match="incomplete"):
        A.decode_mig_allocations(
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb"}]'
        )


# -- config ---------------------------------------------------------------------------------------


def test_allowlist_and_the_older_geometries_form():
    """HAMi TestValidateMigProfileAllowlist, and knownMigGeometries read as the union of its names."""
    cfg = load_config(
        {
            "nvidia": {
                "migProfileAllowlist": [{"models": ["A100"], "profiles": ["1g.5gb", "2g.10gb"]}],
                "knownMigGeometries": [
                    {
                        "models": ["A30"],
                        "allowedGeometries": [
                            [{"name": "1g.6gb", "memory": 6144, "count": 4}],
                            [
                                {"name": "2g.12gb", "memory": 12288, "count": 2},
                                {"name": "1g.6gb", "count": 1},
                            ],
                        ],
                    }
                ],
            }
        }
    )
    assert [(e.models, e.profiles) for e in cfg.nvidia.migProfileAllowlist] == [
        (("A100",), ("1g.5gb", "2g.10gb")),
        (("A30",), ("1g.6gb", "2g.12gb")),
    ]
    assert nvidia_mig.allowed_profiles("NVIDIA A100-SXM4-40GB", cfg.nvidia.migProfileAllowlist) == (
        "1g.5gb",
        "2g.10gb",
    )
    assert nvidia_mig.allowed_profiles("NVIDIA H100", cfg.nvidia.migProfileAllowlist) is None
    with pytest.raises(ConfigError, match=r"migProfileAllowlist\[0\]: needs both"):
        load_config({"nvidia": {"migProfileAllowlist": [{"models": ["A100"]}]}})
    with pytest.raises(ConfigError, match="'10gb' is not a MIG profile"):
        load_config({"nvidia": {"migProfileAllowlist": [{"models": ["A100"], "profiles": ["10gb"]}]}})


# -- usage from the pods' annotations (HAMi's getNodesUsage) ------------------------------------


def _state_with(card: Device, *pods: dict) -> ClusterState:
    st = ClusterState()
    st.upsert_node(node("n1", [card]))
    for p in pods:
        st.upsert_pod(p)
    return st


def _placed(devices: str, mig: str | None, *containers: dict) -> dict:
    annos = {A.ASSIGNED_NODE: "n1", A.NVIDIA_ALLOCATED: devices, A.NVIDIA_TO_ALLOCATE: devices}
    if mig is not None:
        annos[A.MIG_ALLOCATIONS] = mig
    return pod(*(containers or [ctr(gpu=1, mem=5000)]), annotations=annos)


ONE_1G = tuple(P(i, 1) for i in range(7))


def test_usage_restores_mig_allocation_by_profile_and_placement():
    """HAMi TestGetNodesUsageRestoresMigAllocationByProfileAndPlacement."""
    card = mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, (P(6, 1),)),))
    mig = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1},'
        '"migUUID":"MIG-a","gpuInstanceID":7,"computeInstanceID":0}]'
    )
    st = _state_with(card, _placed("GPU-a,NVIDIA,5120,14:;", mig))
    u = st._nodes["n1"].usage["GPU-a"]
    assert (u.used, u.usedmem, u.usedcores, u.mig, u.mig_unknown) == (1, 5120, 14, (P(6, 1),), 0)
    out = st.filter(pod(ctr(gpu=1, mem=1000)), ["n1"])
    assert out.failed_nodes["n1"] == "1/1 CardMigTopologyInfeasible"


def test_usage_fails_closed_without_a_mig_allocation():
    """HAMi TestGetNodesUsageFailsClosedWithoutMigAllocation: the card takes no new instance."""
    card = mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, ONE_1G),))
    st = _state_with(card, _placed("GPU-a,NVIDIA,5120,14:;", None))
    assert st._nodes["n1"].usage["GPU-a"].mig_unknown == 1
    assert st.filter(pod(ctr(gpu=1, mem=1000)), ["n1"]).failed_nodes["n1"] == "1/1 CardNotHealth"


def test_usage_restores_every_instance_of_a_container():
    """HAMi TestGetNodesUsageRestoresUnconsumedMigReservations: two instances of one container."""
    card = mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, (P(5, 1), P(6, 1))),))
    mig = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},'
        '{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]'
    )
    p = _placed("GPU-a,NVIDIA,5120,14:GPU-a,NVIDIA,5120,14:;", mig, ctr(gpu=2, mem=5000))
    st = _state_with(card, p)
    assert st._nodes["n1"].usage["GPU-a"].mig == (P(6, 1), P(5, 1))
    assert st._nodes["n1"].usage["GPU-a"].mig_unknown == 0
    st.remove_pod(p["metadata"]["uid"])
    assert st._nodes["n1"].usage["GPU-a"].mig == ()


def test_finished_init_containers_keep_their_instances_until_the_pod_ends():
    card = mig_card(profiles=(MigProfile("1g.5gb", 5120, 14, 1, (P(5, 1), P(6, 1))),))
    mig = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},'
        '{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]'
    )
    p = _placed("GPU-a,NVIDIA,5120,14:;GPU-a,NVIDIA,5120,14:;", mig, ctr("main", gpu=1, mem=5000))
    p["spec"]["initContainers"] = [ctr("init", gpu=1, mem=5000)]
    p["status"] = {"initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}]}
    st = _state_with(card, p)
    assert sorted(st._nodes["n1"].usage["GPU-a"].mig) == [P(5, 1), P(6, 1)]


# -- the filter end to end (the annotations HAMi writes) -----------------------------------------


def a100_40gb() -> tuple[MigProfile, ...]:
    """An A100-SXM4-40GB as the device plugin registers it from NVML (memory as NVML reports it, cores
    = SMs x 100 / 98 rounded up), with the default allow-list's four profiles."""
    return (
        MigProfile("1g.5gb", 4864, 15, 1, tuple(P(i, 1) for i in range(7))),
        MigProfile("2g.10gb", 9984, 29, 2, (P(0, 2), P(2, 2), P(4, 2))),
        MigProfile("3g.20gb", 20096, 43, 3, (P(0, 4), P(4, 4))),
        MigProfile("7g.40gb", 40192, 100, 7, (P(0, 8),)),
    )


def test_filter_writes_the_reservation_as_hami_does():
    st = ClusterState()
    st.upsert_node(node("n1", [mig_card("GPU-a", a100_40gb())]))
    p = pod(ctr(gpu=1, mem=8000), annotations={"nvidia.com/vgpu-mode": "mig"})
    out = st.filter(p, ["n1"], now=1705054796)
    assert out.node == "n1"
    assert out.annotations == {
        A.ASSIGNED_NODE: "n1",
        A.ASSIGNED_TIME: "1705054796",
        A.NVIDIA_TO_ALLOCATE: "GPU-a,NVIDIA,9984,29:;",
        A.NVIDIA_ALLOCATED: "GPU-a,NVIDIA,9984,29:;",
        A.MIG_ALLOCATIONS: (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
            '"placement":{"start":0,"size":2}}]'
        ),
    }
    # the reservation counts at once: the next pod gets the next 2g placement
    out2 = st.filter(pod(ctr(gpu=1, mem=8000)), ["n1"])
    assert A.decode_mig_allocations(out2.annotations[A.MIG_ALLOCATIONS])[0].placement == P(2, 2)


def test_filter_binpacks_instances_across_cards_and_spreads_on_request():
    cards_ = [mig_card("GPU-a", a100_40gb(), index=0), mig_card("GPU-b", a100_40gb(), index=1)]
    st = ClusterState()
    st.upsert_node(node("n1", cards_))
    first = st.filter(pod(ctr(gpu=1, mem=4000)), ["n1"])
    on = A.decode_mig_allocations(first.annotations[A.MIG_ALLOCATIONS])[0].gpu_uuid
    binpack = {A.GPU_SCHEDULER_POLICY: "binpack"}
    second = st.filter(pod(ctr(gpu=1, mem=4000), annotations=binpack), ["n1"])
    assert A.decode_mig_allocations(second.annotations[A.MIG_ALLOCATIONS])[0].gpu_uuid == on
    third = st.filter(pod(ctr(gpu=1, mem=4000), annotations={A.GPU_SCHEDULER_POLICY: "spread"}), ["n1"])
    assert A.decode_mig_allocations(third.annotations[A.MIG_ALLOCATIONS])[0].gpu_uuid != on


def test_hami_core_pods_do_not_land_on_mig_cards_when_they_say_so():
    st = ClusterState()
    st.upsert_node(node("n1", [mig_card("GPU-a", a100_40gb())]))
    out = st.filter(pod(ctr(gpu=1, mem=4000), annotations={"nvidia.com/vgpu-mode": "hami-core"}), ["n1"])
    assert out.node is None and out.failed_nodes["n1"] == "1/1 CardTypeMismatch"


def test_prefilter_lets_one_mig_card_serve_two_devices():
    st = ClusterState()
    st.upsert_node(node("n1", [mig_card("GPU-a", a100_40gb())]))
    out = st.filter(pod(ctr(gpu=3, mem=4000)), ["n1"])
    assert out.node == "n1"
    assert [a.placement for a in A.decode_mig_allocations(out.annotations[A.MIG_ALLOCATIONS])] == [
        P(6, 1), P(5, 1), P(4, 1)
    ]  # fmt: skip


# -- hami inspect / explain on a MIG card -------------------------------------------------------


def test_inspect_and_explain_show_mig_instances_and_the_profiles_still_free():
    from hami.tools.explain import explain_pod
    from hami.tools.inspect import inspect_cluster
    from hami.tools.snapshot import Listed, Snapshot
    from kubefakes.demo_cluster import DEMO_NOW
    from kubefakes.demo_cluster import node as demo_node
    from kubefakes.demo_cluster import pod as demo_pod

    card = mig_card("GPU-m", a100_40gb())
    n = demo_node("mig-1", [card], now=DEMO_NOW)
    mig = A.encode_mig_allocations(
        [A.MigAllocation(0, 0, "GPU-m", "1g.5gb", P(6, 1), "MIG-x", 2, 0),
         A.MigAllocation(0, 1, "GPU-m", "1g.5gb", P(2, 1), "MIG-y", 3, 0)]
    )  # fmt: skip
    held = demo_pod("default", "held", [("main", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"})],
                    node="mig-1", cards=[[("GPU-m", 4864, 15), ("GPU-m", 4864, 15)]],
                    annotations={A.MIG_ALLOCATIONS: mig})  # fmt: skip
    big = demo_pod("default", "big", [("main", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "15000"})])
    snap = Snapshot.build(Listed([n], [held, big], []), now=DEMO_NOW)
    (nr,) = inspect_cluster(snap).nodes
    (c,) = nr.cards
    assert c.mode == "mig" and c.mig_free == ["1g.5gb", "2g.10gb"]  # every 3g and the 7g placement overlap
    assert [x.mig for x in c.containers] == ["MIG 1g.5gb at slices 6-6", "MIG 1g.5gb at slices 2-2"]
    assert explain_pod(snap, "default", "held").cards == {
        "main": [
            "GPU-m 4864 MiB 15 % (MIG 1g.5gb at slices 6-6)",
            "GPU-m 4864 MiB 15 % (MIG 1g.5gb at slices 2-2)",
        ]
    }
    ex = explain_pod(snap, "default", "big")
    (g,) = [g for g in ex.groups if "mig-1" in g.nodes]
    assert g.reason == "1/1 CardMigTopologyInfeasible" and "without a free placement" in g.words

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami import annotations as A
from hami.cluster import ClusterState
from hami.config import load_config
from hami.model import Device
from tests.builders import V100, cards, ctr, node, pod


def placed(p, out, phase="Running"):
    """The pod as the API server holds it after the extender's patch."""
    p = copy.deepcopy(p)
    p["metadata"]["annotations"].update(out.annotations)
    p["metadata"].setdefault("labels", {}).update(out.labels)
    p["status"] = {"phase": phase}
    return p


def test_filter_reserves_and_annotations_match_hami():
    cs = ClusterState()
    cs.upsert_node(node("node1", cards("node1", 1)))
    p = pod(ctr(gpu=1, mem=8000, cores=10))
    out = cs.filter(p, ["node1"], now=1715328930)
    assert out.node == "node1"
    assert out.annotations == {
        "hami.io/vgpu-node": "node1",
        "hami.io/vgpu-time": "1715328930",
        "hami.io/vgpu-devices-to-allocate": "GPU-node1-0,NVIDIA,8000,10:;",
        "hami.io/vgpu-devices-allocated": "GPU-node1-0,NVIDIA,8000,10:;",
    }
    assert out.labels == {"hami.io/vgpu-node": "node1"}
    assert cs.usage_snapshot() == {"node1": {"GPU-node1-0": (1, 8000, 10)}}


def test_init_container_entries_come_first_and_empty_entries_are_kept():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 2)))
    p = pod(ctr("c1", gpu=1, mem=3000, cores=30), ctr("c2", gpu=2, mem=5000, cores=0), init=[ctr("init")])
    out = cs.filter(p, ["n"])
    value = out.annotations["hami.io/vgpu-devices-to-allocate"]
    entries = A.decode_pod_devices(value)
    assert len(entries) == 3 and entries[0] == [] and len(entries[1]) == 1 and len(entries[2]) == 2
    assert value.startswith(";GPU-n-")


def test_retried_filter_replaces_reservation():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    p = pod(ctr(gpu=1, mem=8000, cores=10))
    cs.filter(p, ["n"])
    cs.filter(p, ["n"])
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 8000, 10)}


def test_pod_events_confirm_release_and_ignore_foreign_scheduler():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    p = pod(ctr(gpu=1, mem=8000, cores=10))
    out = cs.filter(p, ["n"])
    cs.upsert_pod(placed(p, out))
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 8000, 10)}
    cs.upsert_pod(placed(p, out, phase="Succeeded"))
    assert cs.usage_snapshot()["n"] == {}
    # Forged annotations on a pod of another scheduler: never our allocation.
    forged = placed(pod(ctr(gpu=1, mem=8000), scheduler="default-scheduler"), out)
    cs.upsert_pod(forged)
    assert cs.usage_snapshot()["n"] == {}


def test_unknown_node_and_malformed_registration_are_reported_not_raised():
    cs = ClusterState()
    bad = {"metadata": {"name": "bad", "annotations": {A.NVIDIA_REGISTER: "[{"}}}
    reason = cs.upsert_node(bad)
    assert reason.startswith("hami.io/node-nvidia-register: not valid JSON")
    out = cs.filter(pod(ctr(gpu=1)), ["bad", "ghost"])
    assert out.node is None
    assert out.failed_nodes["ghost"] == "node unregistered"
    assert out.failed_nodes["bad"].startswith("hami.io/node-nvidia-register: not valid JSON")


def test_bad_quantity_is_a_request_error():
    cs = ClusterState()
    cs.upsert_node(node("n"))
    out = cs.filter(pod(ctr("main", gpu=1, mem="1000M"), name="p", ns="ns"), ["n"])
    assert out.node is None
    assert out.error.startswith("pod ns/p: container main: nvidia.com/gpumem: '1000M' is 953.674 MiB")


def test_pod_without_devices_passes_through():
    cs = ClusterState()
    out = cs.filter(pod({"name": "c", "resources": {"limits": {"cpu": "1"}}}), ["a", "b"])
    assert out.no_devices and out.node is None and out.failed_nodes == {}


def test_node_policy_binpack_and_spread():
    cs = ClusterState()
    for n in ("a", "b"):
        cs.upsert_node(node(n, cards(n, 2)))
    first = cs.filter(pod(ctr(gpu=1, mem=8000, cores=30)), ["a", "b"])
    assert first.node == "a"
    assert cs.filter(pod(ctr(gpu=1, mem=1000, cores=10)), ["a", "b"]).node == "a"
    spread = pod(ctr(gpu=1, mem=1000, cores=10), annotations={"hami.io/node-scheduler-policy": "spread"})
    out = cs.filter(spread, ["a", "b"])
    assert out.node == "b"
    assert out.failed_nodes == {"a": "node b preferred by node policy spread"}


def test_quota_counts_per_card():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 4)))
    cs.upsert_quota(
        {
            "metadata": {"namespace": "team", "name": "q"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "20000"}},
        }
    )
    out = cs.filter(pod(ctr(gpu=2, mem=8000), ns="team"), ["n"])
    assert out.node == "n"
    assert cs.quota.used("team", "nvidia.com/gpumem") == 16000
    out = cs.filter(pod(ctr(gpu=1, mem=8000), ns="team"), ["n"])
    assert out.node is None and out.failed_nodes["n"] == "4/4 ResourceQuotaNotFit"


def test_per_node_split_override_is_the_plugins_business_but_config_applies():
    cfg = load_config(
        {
            "scheduler": {"nodeSchedulerPolicy": "spread", "gpuSchedulerPolicy": "binpack"},
            "nodeconfig": [{"name": "a", "devicesplitcount": 1}],
        }
    )
    assert cfg.nvidia_for_node("a").deviceSplitCount == 1
    cs = ClusterState(cfg)
    # The device plugin applies the override when it registers; this registration says 10 slots a card.
    cs.upsert_node(node("a", cards("a", 2, count=10)))
    cs.filter(pod(ctr(gpu=1, mem=1000, cores=10)), ["a"])
    out = cs.filter(pod(ctr(gpu=1, mem=1000, cores=10)), ["a"])
    # Card binpack from the config, and a second slot on GPU-a-0 that a split count of 1 would not give.
    assert [c[0].uuid for c in out.devices["NVIDIA"]] == ["GPU-a-0"]
    assert cs.usage_snapshot() == {"a": {"GPU-a-0": (2, 2000, 20)}}


def test_init_done_releases_init_usage():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    p = pod(ctr("app", gpu=1, mem=1000, cores=10), init=[ctr("init", gpu=1, mem=20000, cores=50)])
    out = cs.filter(p, ["n"])
    q = placed(p, out)
    cs.upsert_pod(q)
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 20000, 50)}
    q["status"]["initContainerStatuses"] = [{"name": "init", "state": {"terminated": {"exitCode": 0}}}]
    cs.upsert_pod(q)
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 1000, 10)}


# --- incremental == rebuilt -------------------------------------------------------------------

requests = st.tuples(
    st.integers(1, 2),  # cards
    st.sampled_from([0, 1000, 4000, 12000]),  # MiB (0 = percentage)
    st.sampled_from([0, 10, 30, 100]),  # cores
    st.sampled_from(["", "binpack", "spread"]),
)
events = st.lists(
    st.tuples(st.sampled_from(["add", "delete", "finish"]), requests, st.integers(0, 30)), max_size=40
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events)
def test_incremental_state_equals_rebuild(evs):
    cs = ClusterState()
    nodes = [node(f"n{i}", cards(f"n{i}", 2, mem=16384, count=3)) for i in range(3)]
    for n in nodes:
        cs.upsert_node(n)
    live: list[dict] = []
    for kind, (nums, mem, cores, policy), pick in evs:
        if kind == "add":
            annos = {"hami.io/gpu-scheduler-policy": policy} if policy else {}
            limits = {"gpu": nums, "cores": cores} | ({"mem": mem} if mem else {"pct": 25})
            p = pod(ctr(**limits), annotations=annos)
            out = cs.filter(p, [n["metadata"]["name"] for n in nodes])
            if out.node:
                q = placed(p, out)
                cs.upsert_pod(q)
                live.append(q)
        elif live:
            q = live.pop(pick % len(live))
            if kind == "delete":
                cs.remove_pod(q["metadata"]["uid"])
            else:
                q["status"]["phase"] = "Succeeded"
                cs.upsert_pod(q)
        for st_ in cs.card_stats():
            assert st_.used <= st_.count and st_.usedmem <= st_.devmem and st_.usedcores <= st_.devcore
    rebuilt = ClusterState()
    rebuilt.rebuild(nodes, live)
    assert rebuilt.usage_snapshot() == cs.usage_snapshot()


def test_rebuild_can_keep_unconfirmed_reservations():
    cs = ClusterState()
    n = node("n", cards("n", 1))
    cs.upsert_node(n)
    cs.filter(pod(ctr(gpu=1, mem=8000, cores=10)), ["n"])
    cs.rebuild([n], [], keep_reservations=True)
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 8000, 10)}
    cs.rebuild([n], [])
    assert cs.usage_snapshot()["n"] == {}


def test_quota_snapshot_for_metrics():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 2)))
    cs.upsert_quota(
        {"metadata": {"namespace": "t", "name": "q"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "30000"}}}
    )
    cs.filter(pod(ctr(gpu=2, mem=8000), ns="t"), ["n"])
    assert cs.quota_stats() == [("t", "nvidia.com/gpumem", 16000, 30000)]


def test_node_updates_that_leave_the_registration_alone_keep_usage_and_clear_marks():
    cs = ClusterState()
    n = node("n", cards("n", 1))
    cs.upsert_node(n)
    cs.filter(pod(ctr(gpu=1, mem=8000, cores=10)), ["n"])
    cs.mark_node_unusable("n", "handshake expired")
    locked = copy.deepcopy(n)
    locked["metadata"]["annotations"]["hami.io/mutex.lock"] = "2024-05-10T08:15:30Z,default,p"
    assert cs.upsert_node(locked) is None
    assert cs.node_unusable_reason("n") is None
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 8000, 10)}
    cordoned = copy.deepcopy(locked)
    cordoned["metadata"]["annotations"]["hami.io/device-cordon"] = "GPU-n-0"
    cs.upsert_node(cordoned)
    out = cs.filter(pod(ctr(gpu=1, mem=1000)), ["n"])
    assert out.failed_nodes["n"] == "1/1 CardCordoned"


def test_full_core_request_shares_a_card_registered_with_core_scaling():
    # deviceCoreScaling 2 registers devcore 200: the exclusivity rule (a 100 % request needs an idle
    # card) is for cards of exactly 100 %, so the fit places a gpucores: 100 pod beside a 50 % one, and
    # the prefilter must not refuse the node first with ExclusiveDeviceAllocateConflict.
    scaled = [Device("GPU-n-0", 0, 10, 32768, 200, V100)]
    cs = ClusterState()
    cs.upsert_node(node("n", scaled))
    assert cs.filter(pod(ctr(gpu=1, mem=1000, cores=50)), ["n"]).node == "n"
    out = cs.filter(pod(ctr(gpu=1, mem=1000, cores=100)), ["n"])
    assert out.failed_nodes == {} and out.node == "n"
    assert cs.usage_snapshot() == {"n": {"GPU-n-0": (2, 2000, 150)}}
    # Over the scaled capacity it is refused with the fit's reason.
    out = cs.filter(pod(ctr(gpu=1, mem=1000, cores=100)), ["n"])
    assert out.node is None and out.failed_nodes == {"n": "1/1 CardInsufficientCore"}


def test_a_rebuild_can_leave_its_state_frozen_out_of_the_collectors_sight():
    import gc

    from scheduler_extender.options import ExtenderOptions

    state = ClusterState()
    nodes = [node(f"n{i}", cards(f"n{i}", 2)) for i in range(3)]
    gc.unfreeze()
    try:
        state.rebuild(nodes, [])
        assert gc.get_freeze_count() == 0 and gc.isenabled()
        state.rebuild(nodes, [], freeze_after=True)
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        assert gc.get_count()[0] < 50  # no young collection is due to walk what the rebuild built
        assert sorted(state.node_names()) == ["n0", "n1", "n2"]
    finally:
        gc.unfreeze()
    # The extender freezes after a relist exactly when its GC freezer runs.
    assert ExtenderOptions().sync.freeze_after_rebuild

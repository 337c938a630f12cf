"""Every vendor together: one node each, the webhook over all vendors, a mixed pod, quota per vendor, and
a property test that incremental usage equals the rebuild from annotations with no card over-committed."""

import copy

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.errors import InvalidRequest
from hami.vendors import build_vendors, pod_takes_node_lock
from tests.vendor_fleet import CONFIG, EXPECTED, ONE_SHARE, container, fleet, node, pod, state
from webhook.mutate import Mutator, WebhookSettings

VENDORS = build_vendors(CONFIG)
FLEET = fleet()
NAMES = [n["metadata"]["name"] for n in FLEET.values()]


def test_every_vendor_schedules_on_its_own_node_in_a_mixed_fleet():
    st_ = state(*FLEET.values())
    for cw, (limits, key) in ONE_SHARE.items():
        out = st_.filter(pod(f"p-{cw.lower()}", container("c", limits)), NAMES)
        assert out.node == FLEET[cw]["metadata"]["name"], (cw, out.failed_nodes)
        assert out.annotations[key].endswith(":;"), cw
        assert out.annotations["hami.io/vgpu-node"] == out.node
        others = {k for k in out.annotations if k in {v.allocated_key for v in VENDORS.values()} and k != key}
        assert others == set(), cw


def test_a_pod_may_ask_two_vendors_in_two_containers():
    both = node(
        "mix",
        annotations=FLEET["NVIDIA"]["metadata"]["annotations"],
        capacity=FLEET["MLU"]["status"]["capacity"],
    )
    p = pod("m", container("a", ONE_SHARE["NVIDIA"][0]), container("b", ONE_SHARE["MLU"][0]))
    out = state(both, *FLEET.values()).filter(p, ["mix", *NAMES])
    assert out.node == "mix"
    assert out.annotations["hami.io/vgpu-devices-allocated"] == "GPU-nv-0,NVIDIA,1000,10:;;"
    assert out.annotations["hami.io/cambricon-mlu-devices-allocated"] == ";mix-cambricon-mlu-0,MLU,5120,30:;"
    assert out.failed_nodes["nv-a"] == "NodeInsufficientDevice: no MLU device"


def test_quota_per_vendor():
    quotas = {
        "MLU": ("cambricon.com/mlu.smlu.vmemory", "20"),  # 20 units of 256 MiB: one 5120 MiB share
        "AMD": ("amd.com/gpumem", "49152"),
        "Mthreads": ("mthreads.com/sgpu-memory", "8"),
        "Metax-SGPU": ("metax-tech.com/vmemory", "8"),
        "DCU": ("hygon.com/dcumem", "1000"),
    }
    for cw, (res, limit) in quotas.items():
        s = state(FLEET[cw])
        s.upsert_quota(
            {"metadata": {"namespace": "team", "name": "q"}, "spec": {"hard": {f"limits.{res}": limit}}}
        )
        limits, _ = ONE_SHARE[cw]
        first = s.filter(pod(f"a-{cw}", container("c", limits), ns="team"), [FLEET[cw]["metadata"]["name"]])
        assert first.node is not None, (cw, first.failed_nodes)
        second = s.filter(pod(f"b-{cw}", container("c", limits), ns="team"), [FLEET[cw]["metadata"]["name"]])
        assert second.node is None and "ResourceQuotaNotFit" in next(iter(second.failed_nodes.values())), cw


def test_node_lock_only_for_vendors_whose_plugins_use_it():
    lock = {cw for cw, v in VENDORS.items() if v.uses_node_lock}
    assert lock == {"NVIDIA", "DCU", "Metax-SGPU", "XPU", "AMD", "Vastai", "Biren",
                    *(c for c in VENDORS if c.startswith(("Ascend", "MR-", "BI-")))}  # fmt: skip
    assert pod_takes_node_lock(pod("n", container("c", ONE_SHARE["NVIDIA"][0])), VENDORS)
    assert not pod_takes_node_lock(pod("m", container("c", ONE_SHARE["Mthreads"][0])), VENDORS)
    # HAMi locks for vendors asked by app containers; a pod whose only device is in an init container
    # asks none, and takes the lock on the safe side.
    init_only = pod("i", container("c", {}), init=[container("i", ONE_SHARE["Mthreads"][0])])
    assert pod_takes_node_lock(init_only, VENDORS)
    assert pod_takes_node_lock(None, VENDORS)


def test_webhook_takes_every_vendors_pod_and_strips_every_vendors_keys():
    mut = Mutator(list(VENDORS.values()), WebhookSettings())
    for v in VENDORS.values():
        for k in v.allocation_keys():
            assert k in mut.protected_annotation_keys, (v.common_word, k)
    for cw, (limits, _) in ONE_SHARE.items():
        p = pod(f"w-{cw}", container("c", limits))
        p["spec"]["schedulerName"] = "default-scheduler"
        d = mut.mutate_pod(p)
        assert d.allowed, (cw, d.message)
        ops = {op["path"]: op.get("value") for op in d.patch}
        assert ops.get("/spec/schedulerName") == "hami-scheduler", (cw, d.patch)


def test_webhook_denials_name_the_vendor_rule():
    mut = Mutator(list(VENDORS.values()), WebhookSettings())
    cases = {
        "mthreads": ({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 3}, "sGPU memory request value is invalid"),
        "ascend": ({"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 99999}, "huawei.com/Ascend910B3-memory 99999 is invalid"),
        "aws": ({"aws.amazon.com/neuroncore": 3}, "must be 1 or a multiple of 2, got 3"),
        "enflame": ({"enflame.com/gcu-core": 101}, "enflame.com/gcu-core must be in range (0,100]"),
    }  # fmt: skip
    for name, (limits, message) in cases.items():
        d = mut.mutate_pod(pod(f"d-{name}", container("c", limits)))
        assert not d.allowed and message in d.message, (name, d.message)


# ---------------------------------------------------------------------------------------------------
# Property: incremental == rebuild, never over-committed.

_VENDOR_WORDS = sorted(ONE_SHARE)


@st.composite
def _workload(draw):
    nodes = [
        copy.deepcopy(FLEET[cw])
        for cw in draw(st.lists(st.sampled_from(_VENDOR_WORDS), min_size=1, max_size=5, unique=True))
    ]
    pods = []
    for i in range(draw(st.integers(1, 12))):
        cws = draw(st.lists(st.sampled_from(_VENDOR_WORDS), min_size=1, max_size=2))
        containers = [container(f"c{j}", ONE_SHARE[cw][0]) for j, cw in enumerate(cws)]
        pods.append(pod(f"p{i}", *containers))
    deletes = draw(st.lists(st.integers(0, 11), max_size=4))
    return nodes, pods, deletes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workload())
def test_incremental_state_equals_rebuild_and_no_card_is_over_committed(work):
    nodes, pods, deletes = work
    live = state(*nodes)
    names = [n["metadata"]["name"] for n in nodes]
    placed = {}
    for p in pods:
        out = live.filter(p, names)
        if out.node is not None:
            obj = copy.deepcopy(p)
            obj["metadata"]["annotations"].update(out.annotations)
            live.upsert_pod(obj)  # the pod event that confirms the reservation
            placed[obj["metadata"]["uid"]] = obj
    for i in deletes:
        uid = f"uid-p{i}"
        if uid in placed:
            live.remove_pod(uid)
            del placed[uid]
    rebuilt = state()
    rebuilt.rebuild(nodes, list(placed.values()))
    assert rebuilt.usage_snapshot() == live.usage_snapshot()
    for c in live.card_stats():
        assert c.used <= c.count and c.usedmem <= c.devmem and c.usedcores <= c.devcore, c


def test_exact_annotations_of_every_vendor_in_one_fleet():
    st_ = state(*FLEET.values())
    for cw, (pins, expected) in EXPECTED.items():
        out = st_.filter(pod(f"x-{cw.lower()}", container("c", ONE_SHARE[cw][0]), annotations=pins), NAMES)
        assert {k: out.annotations.get(k) for k in expected} == expected, cw


# ---------------------------------------------------------------------------------------------------
# Vendor node scores (HAMi ScoreNode): the topology term decides between fitting nodes.


def test_metax_topology_table_picks_the_node_with_the_lowest_loss():
    cap = {"metax-tech.com/gpu": "4"}
    lossy = node(
        "mx-lossy", capacity=cap, annotations={"metax-tech.com/gpu.topology.losses": '{"1":0,"2":480}'}
    )
    tight = node(
        "mx-tight", capacity=cap, annotations={"metax-tech.com/gpu.topology.losses": '{"1":0,"2":120}'}
    )
    st_ = state(lossy, tight)
    out = st_.filter(pod("m", container("c", {"metax-tech.com/gpu": 2})), ["mx-lossy", "mx-tight"])
    assert out.node == "mx-tight"
    assert out.failed_nodes["mx-lossy"] == "node mx-tight preferred by the Metax-GPU topology score"
    v = VENDORS["Metax-GPU"]
    cards = {d.uuid: d for d in v.node_devices(tight)}
    two = [[c for c in out.devices["Metax-GPU"][0]]]
    assert v.node_score(two, cards=cards, node_policy="binpack") == 2000 - 120
    assert v.node_score(two, cards=cards, node_policy="spread") == 0.0  # no scores table on the node


def test_ascend_network_id_score_keeps_a_containers_npus_in_one_network():
    v = VENDORS["Ascend910B3"]
    (n,) = [FLEET["Ascend910B3"]]
    cards = {d.uuid: d for d in v.node_devices(n)}
    from hami.model import ContainerDevice

    same = [
        [
            ContainerDevice("ascend-7a2c-0", "Ascend910B3", 0, 0),
            ContainerDevice("ascend-7a2c-1", "Ascend910B3", 0, 0),
        ]
    ]
    assert v.node_score(same, cards=cards, node_policy="binpack") == 10.0
    split_reg = (
        '[{"id":"s-0","count":7,"devmem":65536,"devcore":20,"type":"Ascend910B3","health":true,"custominfo":{"NetworkID":0}},'
        '{"id":"s-1","index":1,"count":7,"devmem":65536,"devcore":20,"type":"Ascend910B3","health":true,"custominfo":{"NetworkID":1}}]'
    )
    split = node("aaa-split", annotations={"hami.io/node-register-Ascend910B3": split_reg})
    out = state(split, n).filter(
        pod("p", container("c", {"huawei.com/Ascend910B3": 2})), ["aaa-split", "npu-a"]
    )
    # Both empty: the node policy alone would take aaa-split (ties by name); one NetworkID wins.
    assert out.node == "npu-a"
    assert out.failed_nodes["aaa-split"] == "node npu-a preferred by the Ascend910B3 topology score"


def test_webhook_patches_of_vendor_mutations_and_idempotence():
    mut = Mutator(list(VENDORS.values()), WebhookSettings())
    cases = {
        "metax-qos": ({"metax-tech.com/sgpu": 1},
                      [{"op": "add", "path": "/metadata/annotations/metax-tech.com~1sgpu-qos-policy", "value": "best-effort"}]),
        "mthreads-whole": ({"mthreads.com/vgpu": 2}, [
            {"op": "add", "path": "/metadata/annotations/mthreads.com~1request-gpu-num", "value": "2"},
            {"op": "add", "path": "/spec/containers/0/resources/limits/mthreads.com~1sgpu-core", "value": "32"},
            {"op": "add", "path": "/spec/containers/0/resources/limits/mthreads.com~1sgpu-memory", "value": "192"}]),
        "iluvatar-env": ({"iluvatar.ai/BI-V150-vgpu": 2}, [
            {"op": "add", "path": "/spec/containers/0/resources/limits/iluvatar.ai~1BI-V150.vCore", "value": "200"},
            {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "SOL_CONTINER_NAME", "value": "c"}]}]),
        "ascend-template": ({"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 12000}, [
            {"op": "replace", "path": "/spec/containers/0/resources/limits/huawei.com~1Ascend910B3-memory", "value": "16384"},
            {"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"huawei.com/Ascend910B3-memory": "16384"}}]),
    }  # fmt: skip
    for name, (limits, patch) in cases.items():
        p = pod(f"w-{name}", container("c", limits))
        d = mut.mutate_pod(copy.deepcopy(p))
        assert d.allowed and list(d.patch) == patch, (name, d.patch)
        again = mut.mutate_pod(jsonpatch.apply_patch(p, list(d.patch)))
        assert list(again.patch) == [], (name, again.patch)


@pytest.mark.parametrize(
    ("cw", "limits", "message"),
    [
        ("Metax-SGPU", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": "-1"},
         "resources.limits[metax-tech.com/vcore]: '-1' is negative; it must be a whole number of percent >= 0"),
        ("Mthreads", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-core": "1.5"},
         "resources.limits[mthreads.com/sgpu-core]: '1.5' is not a whole number of sGPU cores"),
        ("AMD", {"amd.com/gpu": 1, "amd.com/gpucores": "1.5"},
         "resources.limits[amd.com/gpucores]: '1.5' is not a whole number of percent"),
        ("Enflame", {"enflame.com/drs-gcu": "1.5"},
         "resources.limits[enflame.com/drs-gcu]: '1.5' is not a whole number of slices"),
        ("Enflame", {"enflame.com/gcu-memory": 100, "enflame.com/gcu-core": "1.5"},
         "resources.limits[enflame.com/gcu-core]: '1.5' is not a whole number of percent"),
        ("MLU", {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vcore": "-3"},
         "resources.limits[cambricon.com/mlu.smlu.vcore]: '-3' is negative; it must be a whole number of percent >= 0"),
        ("Ascend910B3", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-core": "2147483648"},
         "resources.limits[huawei.com/Ascend910B3-core]: '2147483648' is larger than 2147483647 percent"),
        ("NVIDIA", {"nvidia.com/gpu": "1.5"}, "nvidia.com/gpu: '1.5' is not a whole number of devices"),
    ],
    ids=["metax-vcore", "mthreads-core", "amd-cores", "enflame-size", "enflame-core", "mlu-vcore", "ascend-core",
         "nvidia-count"],
)  # fmt: skip
def test_request_errors_name_the_resource_s_own_unit(cw, limits, message):
    with pytest.raises(InvalidRequest) as e:
        VENDORS[cw].container_request(container("c", limits))
    assert str(e.value) == f"container c: {message}"


@pytest.mark.parametrize(
    ("capacity", "reason"),
    [
        ({"mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "1.5"},
         "Mthreads inventory: status.capacity[mthreads.com/sgpu-memory]: '1.5' is not a whole number of 512 MiB units"),
        ({"mthreads.com/sgpu-core": "3.5", "mthreads.com/sgpu-memory": "192"},
         "Mthreads inventory: status.capacity[mthreads.com/sgpu-core]: '3.5' is not a whole number of sGPU cores"),
        ({"cambricon.com/mlu.smlu.vcore": "400", "cambricon.com/mlu.smlu.vmemory": "-1"},
         "MLU inventory: status.capacity[cambricon.com/mlu.smlu.vmemory]: '-1' is negative; it must be a whole "
         "number of 256 MiB units >= 0"),
        ({"aws.amazon.com/neuron": "16", "aws.amazon.com/neuroncore": "3.5"},
         "AWSNeuron inventory: status.capacity[aws.amazon.com/neuroncore]: '3.5' is not a whole number of NeuronCores"),
    ],
    ids=["mthreads-memory", "mthreads-cores", "mlu-memory", "neuron-cores"],
)  # fmt: skip
def test_malformed_capacity_reason_names_the_unit(capacity, reason):
    why = state().upsert_node(node("bad", capacity=capacity))
    assert why is not None and why.endswith(reason), why

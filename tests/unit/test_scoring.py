import json

import pytest

from hami.errors import InvalidRequest
from hami.model import Device, DeviceUsage
from hami.scoring import (
    CardPolicy,
    NodePolicy,
    PolicyError,
    PolicyProblem,
    ScoringWeights,
    best_combination,
    card_score,
    choose_policies,
    node_score,
    order_cards,
    parse_card_policy,
    parse_node_policy,
    parse_weights,
)

D = Device("GPU-a", 0, 10, 1000, 100, "NVIDIA-T4")


def test_card_score_includes_the_request():
    # HAMi's request term is always 0 for real NVIDIA cards; ours counts the container's own share.
    empty = card_score(D, DeviceUsage(), mem=500, cores=50, weights=ScoringWeights())
    assert empty == pytest.approx(10 * (1 / 10 + 50 / 100 + 500 / 1000))
    used = card_score(
        D, DeviceUsage(2, 100, 10), mem=0, cores=0, weights=ScoringWeights(slot=0, core=2, memory=0)
    )
    assert used == pytest.approx(10 * 2 * 10 / 100)
    assert (
        card_score(Device("x", 0, 0, 1, 1, "t"), DeviceUsage(), mem=1, cores=1, weights=ScoringWeights())
        == 0.0
    )


def test_order_cards_chains_and_ties():
    a = Device("a", 0, 10, 1000, 100, "t", numa=1)
    b = Device("b", 1, 10, 1000, 100, "t", numa=0)
    c = Device("c", 2, 10, 1000, 100, "t", numa=0)
    items = [(a, DeviceUsage(), 5.0), (b, DeviceUsage(), 5.0), (c, DeviceUsage(3), 9.0)]
    assert [d.uuid for d, *_ in order_cards(items, (CardPolicy.BINPACK,))] == ["c", "b", "a"]
    assert [d.uuid for d, *_ in order_cards(items, (CardPolicy.SPREAD,))] == ["b", "a", "c"]
    assert [d.uuid for d, *_ in order_cards(items, (CardPolicy.NUMA, CardPolicy.BINPACK))] == ["c", "b", "a"]
    assert [d.uuid for d, *_ in order_cards(items, (CardPolicy.MUTEX,))] == ["a", "b", "c"]


def test_parse_card_policy_trims_and_chains():
    assert parse_card_policy(" binpack , numa ") == (CardPolicy.BINPACK, CardPolicy.NUMA)
    with pytest.raises(
        InvalidRequest, match="unknown policy 'packed'; valid: binpack, spread, numa, mutex, topology-aware"
    ):
        parse_card_policy("binpack,packed")


def test_parse_weights():
    assert parse_weights("slot=1,core=1,memory=3") == ScoringWeights(1, 1, 3)
    for bad in (
        "slot=1,core=1",
        "slot=0,core=0,memory=0",
        "slot=-1,core=1,memory=1",
        "slot=1,core=1,memory=1,gpu=2",
        "x",
    ):
        with pytest.raises(InvalidRequest, match="hami.io/device-scoring-weights"):
            parse_weights(bad)


def test_unknown_policy_falls_back_and_is_reported():
    c = choose_policies(
        {"hami.io/node-scheduler-policy": "spreadd", "hami.io/gpu-scheduler-policy": " binpack "},
        node_default="binpack",
        card_default="spread",
    )
    assert c.node is NodePolicy.BINPACK
    assert c.cards == (CardPolicy.BINPACK,)
    assert (
        len(c.warnings) == 1
        and "unknown policy 'spreadd'" in c.warnings[0]
        and "using the default 'binpack'" in c.warnings[0]
    )


def test_node_score():
    assert node_score(10, 5, 100, 50, 1000, 250) == pytest.approx(10 * (0.5 + 0.5 + 0.25))
    assert node_score(0, 0, 0, 0, 0, 0) == 0.0


def test_best_combination_prefers_highest_total_pair_score():
    s = {"a": {"b": 1, "c": 100}, "b": {"a": 1, "c": 1}, "c": {"a": 100, "b": 1}}
    assert sorted(best_combination(["a", "b", "c"], 2, s)) == ["a", "c"]
    assert best_combination(["a", "b", "c"], 1, s) == ["b"]


# --- one grammar for the policy annotations (webhook and scheduler) ------------------------------

GPU_POLICY = "hami.io/gpu-scheduler-policy"
NODE_POLICY = "hami.io/node-scheduler-policy"
WEIGHTS = "hami.io/device-scoring-weights"


def test_policy_names_are_case_insensitive_and_empty_links_are_dropped():
    assert parse_node_policy(" Spread ") is NodePolicy.SPREAD
    assert parse_card_policy("Binpack") == (CardPolicy.BINPACK,)
    assert parse_card_policy("binpack,") == (CardPolicy.BINPACK,)
    assert parse_card_policy("SPREAD, ,Topology-Aware") == (CardPolicy.SPREAD, CardPolicy.TOPOLOGY_AWARE)


def test_a_policy_named_twice_is_an_error_with_its_kind():
    with pytest.raises(PolicyError, match="names a policy twice") as e:
        parse_card_policy("binpack,Binpack")
    assert (e.value.key, e.value.problem) == (GPU_POLICY, PolicyProblem.DUPLICATE)
    with pytest.raises(PolicyError) as e:
        parse_card_policy("binpack, Nuam")
    assert (e.value.problem, e.value.part) == (PolicyProblem.UNKNOWN, "Nuam")
    with pytest.raises(PolicyError) as e:
        parse_weights("slot=1,core=x,memory=1")
    assert (e.value.key, e.value.problem, e.value.part) == (WEIGHTS, PolicyProblem.MALFORMED, "core=x")


POLICY_VALUES = [
    (NODE_POLICY, "Binpack"), (NODE_POLICY, "SPREAD"), (NODE_POLICY, " spread "), (NODE_POLICY, "binpak"),
    (NODE_POLICY, ""), (GPU_POLICY, "Binpack"), (GPU_POLICY, "Spread"), (GPU_POLICY, "binpack,"),
    (GPU_POLICY, "binpack, numa"), (GPU_POLICY, "binpack,nuam"), (GPU_POLICY, ","), (GPU_POLICY, "spread,spread"),
    (GPU_POLICY, " "), (WEIGHTS, "slot=1,core=1,memory=3"), (WEIGHTS, "slot=1,core=1"), (WEIGHTS, ""),
    (WEIGHTS, "slot=0,core=0,memory=0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value"), POLICY_VALUES, ids=[f"{k.split('/')[1]}={v!r}" for k, v in POLICY_VALUES]
)
def test_webhook_denies_exactly_the_policy_values_the_scheduler_would_not_use(key, value):
    from hami.vendors import build_vendors
    from webhook.app import review_body
    from webhook.mutate import Mutator

    warned = choose_policies({key: value}, node_default="binpack", card_default="spread").warnings
    pod = {
        "metadata": {"name": "p", "annotations": {key: value}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    body = json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                    "namespace": "ml", "object": pod},
    }).encode()  # fmt: skip
    _, reply, _ = review_body(Mutator(list(build_vendors().values())), body)
    assert reply["response"]["allowed"] is not bool(warned), (warned, reply["response"].get("status"))

import pytest

from hami.errors import InvalidRequest
from hami.model import Device, DeviceUsage
from hami.scoring import (
    CardPolicy,
    NodePolicy,
    ScoringWeights,
    best_combination,
    card_score,
    choose_policies,
    node_score,
    order_cards,
    parse_card_policy,
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

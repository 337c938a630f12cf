"""hami.simulate.candidates: the replay hands the filter a few nodes at a time, with the same decisions
and failure reasons as one filter call with every fitting node."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hami.config import DeviceConfig
from hami.scoring import NodePolicy
from hami.simulate import replay
from hami.simulate.candidates import PolicyOrder, Refusals
from hami.simulate.engine import Mode, parse_policy, run
from hami.simulate.fragorder import FragmentationOrder
from hami.simulate.generate import generate_default

CFG = DeviceConfig()


def _run(workload, policy, mode, *, narrowed, monkeypatch, first=None):
    with monkeypatch.context() as m:
        if not narrowed:
            m.setattr(replay.Replay, "_plan", lambda self, obj, kind: None)
        if first is not None:
            m.setattr(PolicyOrder.split, "__defaults__", (first,))
            m.setattr(FragmentationOrder.split, "__defaults__", (first,))
        return run(workload, config=CFG, policy=parse_policy(policy), mode=mode, seed=3, placements=True)


@pytest.mark.parametrize(
    "policy",
    ["binpack", "spread", "binpack/spread", "spread/binpack", "fragmentation", "fragmentation/binpack"],
)
@pytest.mark.parametrize("mode", [Mode.FILL, Mode.TRACE])
def test_same_placements_and_failure_reasons_as_one_call_with_every_node(policy, mode, monkeypatch):
    w = generate_default(config=CFG, seed=2, nodes=60, pods=900)
    whole = _run(w, policy, mode, narrowed=False, monkeypatch=monkeypatch)
    # A first call of 2 nodes makes the next calls (8, 32, ... nodes) common, not only the first one.
    for first in (None, 2):
        part = _run(w, policy, mode, narrowed=True, monkeypatch=monkeypatch, first=first)
        assert part.placements == whole.placements
        assert part.failure_reasons == whole.failure_reasons
        assert (part.scheduled, part.failed, part.gpu_allocation_ratio) == (
            whole.scheduled,
            whole.failed,
            whole.gpu_allocation_ratio,
        )
    assert whole.failed_gpu_pods > 0  # the failure path was compared too
    assert any(p.reason.startswith("0/") for p in whole.placements)


@pytest.mark.parametrize("policy", ["binpack", "fragmentation"])
def test_the_narrowed_replay_hands_the_filter_few_names(policy, monkeypatch):
    w = generate_default(config=CFG, seed=2, nodes=200, pods=900)
    sizes = []
    real = replay.ClusterState.filter

    def counting(self, pod, node_names, **kw):
        sizes.append(len(node_names))
        return real(self, pod, node_names, **kw)

    monkeypatch.setattr(replay.ClusterState, "filter", counting)
    r = run(w, config=CFG, policy=parse_policy(policy), mode=Mode.FILL, seed=1)
    gpu_calls = r.gpu_pods
    assert len(sizes) >= gpu_calls
    # Most calls get the first few nodes; only a few get the next ones.
    assert sum(1 for s in sizes if s <= 16) > 0.8 * len(sizes)
    assert len(sizes) < 1.3 * gpu_calls


def test_policy_order_refresh_keeps_the_filter_order():
    class State:
        def __init__(self, scores):
            self.scores = scores

        def node_scores(self, names):
            return {n: self.scores[n] for n in names if n in self.scores}

    rng = random.Random(1)
    for _ in range(150):
        n = rng.randint(1, 30)
        names = [f"n{rng.randint(0, 99):02d}-{k}" for k in range(n)]
        scores = {x: float(rng.randint(0, 4)) for x in names if rng.random() < 0.9}
        state = State(scores)
        for policy in (NodePolicy.BINPACK, NodePolicy.SPREAD):
            order = PolicyOrder(names, state, policy)
            sign = -1.0 if policy is NodePolicy.BINPACK else 1.0
            for _ in range(20):
                i = rng.randrange(n)
                if rng.random() < 0.1:
                    scores.pop(names[i], None)
                else:
                    scores[names[i]] = float(rng.randint(0, 4))
                order.refresh(i)
                # the filter's order: (sign x score, name); unknown nodes last
                want = sorted(range(n), key=lambda j: (sign * scores.get(names[j], sign * np.inf), names[j]))
                assert order.perm.tolist() == want
                mask = np.array([rng.random() < 0.5 for _ in range(n)])
                first, rest = order.split(mask, 3)
                picked = [j for j in want if mask[j]]
                assert first == [names[j] for j in picked[:3]]
                assert order.names_of(rest) == [names[j] for j in picked[3:]]


def test_refusals_count_the_learned_reasons_and_forget_a_changed_node():
    k = Refusals(5)
    index = {f"n{i}": i for i in range(5)}
    rows = [k.row(("kind", i)) for i in range(6)]  # more kinds than the first allocation
    assert rows == list(range(6)) and k.row(("kind", 2)) == 2
    k.learn(5, {"n0": "1/1 CardInsufficientMemory", "n3": "1/1 CardInsufficientMemory", "n4": "x"}, index)
    assert k.unknown(5).tolist() == [False, True, True, False, False]
    assert k.unknown(0).all()
    mask = np.array([True, False, False, True, True])
    assert k.counts(5, mask) == {"1/1 CardInsufficientMemory": 2, "x": 1}
    k.forget(3)
    assert k.unknown(5).tolist() == [False, True, True, True, False]
    with pytest.raises(AssertionError):
        k.counts(5, mask)


def test_kept_request_parses_equal_a_fresh_parse_and_stay_bounded():
    from hami.cluster import ClusterState
    from hami.errors import InvalidRequest
    from hami.simulate.workload import DEFAULT_GPU_MODELS, openb_pod

    def obj(milli, cpu=1000):
        return openb_pod(
            f"p{milli}-{cpu}", cpu_milli=cpu, memory_mib=1024, num_gpu=1, gpu_milli=milli, gpu_spec=[],
            config=CFG, gpu_models=DEFAULT_GPU_MODELS,
        ).obj  # fmt: skip

    fresh, kept = ClusterState(config=CFG), ClusterState(config=CFG, request_memo=2)
    pods = [obj(m, c) for m in (250, 500, 1000) for c in (1000, 2000)] * 2
    for p in pods:
        assert kept.pod_requests(p) == fresh.pod_requests(p)
    assert len(kept._request_memo) == 2
    bad = obj(500)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "two"
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            kept.pod_requests(bad)
    # a kept list handed out and changed by a caller does not change the kept parse
    kept.pod_requests(pods[0]).clear()
    assert kept.pod_requests(pods[0]) == fresh.pod_requests(pods[0]) != []

"""hami.prefilter.VerdictIndex answers exactly what `prefilter` answers, however nodes change in between."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.model import Device, DeviceUsage
from hami.prefilter import CardSummary, Need, VerdictIndex, prefilter

NAMES = [f"n{i}" for i in range(6)]


@dataclass
class FakeNode:
    """What the prefilter reads of a node; `touch` drops the summaries as the cluster's node does."""

    name: str
    devices: dict[str, list[Device]]
    usage: dict[str, DeviceUsage] = field(default_factory=dict)
    unusable: str | None = None
    summaries: dict[str, CardSummary] = field(default_factory=dict)

    def summary(self, vendor: str) -> CardSummary:
        s = self.summaries.get(vendor)
        if s is None:
            s = self.summaries[vendor] = CardSummary.of(self.devices.get(vendor, ()), self.usage, frozenset())
        return s


def make(name: str, cards: int, vendor: str) -> FakeNode:
    return FakeNode(
        name, {vendor: [Device(f"{name}-{i}", i, 2, 1000, 100, "NVIDIA-T4") for i in range(cards)]}
    )


needs_st = st.dictionaries(
    st.sampled_from(["NVIDIA", "MLU"]),
    st.lists(
        st.builds(
            Need,
            st.integers(1, 3),
            st.sampled_from([0, 300, 800]),
            st.sampled_from([0, 50]),
            st.sampled_from([0, 50, 100]),
            st.just(()),
        ),  # fmt: skip
        min_size=1,
        max_size=2,
        unique=True,
    ).map(tuple),
    min_size=1,
    max_size=2,
)
step_st = st.one_of(
    st.tuples(st.just("use"), st.sampled_from(NAMES), st.integers(0, 3), st.sampled_from([0, 400, 900])),
    st.tuples(st.just("unusable"), st.sampled_from(NAMES), st.booleans(), st.just(0)),
    st.tuples(st.just("remove"), st.sampled_from(NAMES), st.just(0), st.just(0)),
    st.tuples(st.just("add"), st.sampled_from(NAMES), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("filter"), st.just(""), st.just(0), st.just(0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # A few demands asked again and again (as pods of one workload do), with changes in between.
    demands=st.lists(needs_st, min_size=1, max_size=3),
    steps=st.lists(
        st.tuples(step_st, st.integers(0, 2), st.lists(st.sampled_from([*NAMES, "ghost"]), max_size=8)),
        max_size=40,
    ),
    max_demands=st.integers(1, 4),
    max_log=st.sampled_from([4, 16, 1000]),
)
def test_the_index_equals_prefilter_after_any_changes(demands, steps, max_demands, max_log):
    nodes = {n: make(n, 2, "NVIDIA") for n in NAMES[:4]}
    nodes["n4"] = make("n4", 1, "MLU")
    index = VerdictIndex(max_demands=max_demands, max_log=max_log)
    for (op, name, a, b), which, names in steps:
        needs = demands[which % len(demands)]
        n = nodes.get(name)
        if op == "use" and n is not None:
            devs = next(iter(n.devices.values()))
            if a < len(devs):
                n.usage[devs[a].uuid] = DeviceUsage(1, b, 50)
        elif op == "unusable" and n is not None:
            n.unusable = "handshake expired" if a else None
        elif op == "remove":
            nodes.pop(name, None)
        elif op == "add":
            nodes[name] = make(name, a, "NVIDIA")
        if op != "filter":
            if n is not None:
                n.summaries.clear()
            index.changed(name)
        want_failed: dict[str, str] = {}
        want = prefilter(nodes, names, needs, want_failed)
        got_failed: dict[str, str] = {}
        got = index.candidates(nodes, names, needs, got_failed)
        assert [x.name for x in got] == [x.name for x in want]
        assert got_failed == want_failed


def test_a_reset_forgets_every_verdict():
    nodes = {"a": make("a", 1, "NVIDIA")}
    index = VerdictIndex()
    need = {"NVIDIA": (Need(1, 500, 0, 0, ()),)}
    assert [n.name for n in index.candidates(nodes, ["a"], need, {})] == ["a"]
    nodes["a"].usage["a-0"] = DeviceUsage(1, 800, 0)
    nodes["a"].summaries.clear()
    index.reset()
    failed: dict[str, str] = {}
    assert index.candidates(nodes, ["a"], need, failed) == []
    assert failed == {"a": "1/1 CardInsufficientMemory"}


def test_all_nodes_asked_duplicates_and_unknown_names_give_prefilters_answer():
    nodes = {"a": make("a", 1, "NVIDIA"), "b": make("b", 1, "NVIDIA"), "c": make("c", 1, "MLU")}
    nodes["b"].usage["b-0"] = DeviceUsage(1, 900, 0)
    need = {"NVIDIA": (Need(1, 500, 0, 0, ()),)}
    index = VerdictIndex()
    for names in (["a", "b", "c"], ["c", "b", "a"], ["a", "b", "b"], ["b", "ghost"], ["b", "c", "c"], []):
        want: dict[str, str] = {}
        got: dict[str, str] = {}
        assert [n.name for n in index.candidates(nodes, names, need, got)] == [
            n.name for n in prefilter(nodes, names, need, want)
        ]
        assert got == want, names


def test_a_demand_asked_again_with_a_share_of_the_nodes_keeps_verdicts():
    # kube-scheduler names a rotating share of the nodes (40 % of 1213): a demand asked for twice gets
    # verdicts over every node, so later asks are set lookups; the simulator's best few never do.
    nodes = {f"n{i}": make(f"n{i}", 1, "NVIDIA") for i in range(8)}
    need = {"NVIDIA": (Need(1, 500, 0, 0, ()),)}
    index = VerdictIndex()
    index.candidates(nodes, ["n0"], need, {})
    index.candidates(nodes, ["n1"], need, {})
    assert len(index._by_key) == 0  # one name of eight: judged alone, every time
    failed: dict[str, str] = {}
    got = index.candidates(nodes, ["n3", "n4", "n5"], need, failed)  # a quarter, asked for before
    assert len(index._by_key) == 1 and [n.name for n in got] == ["n3", "n4", "n5"] and failed == {}
    other = {"NVIDIA": (Need(1, 600, 0, 0, ()),)}
    index.candidates(nodes, ["n0", "n1", "n2"], other, {})
    assert len(index._by_key) == 1  # a demand's first ask: judged alone

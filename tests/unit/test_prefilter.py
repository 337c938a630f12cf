"""hami.prefilter: the card summaries never refuse a node the fit accepts, and give the fit's reasons."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.card_checks import core_reason
from hami.fit import NodeView, fit_pod
from hami.model import PERCENTAGE_UNSET, ContainerRequest, Device, DeviceUsage, Selection
from hami.pods import ContainerKind, ContainerSpec
from hami.prefilter import CardSummary, Need, pod_needs
from hami.reason_words import Reason
from hami.scoring import CardPolicy, NodePolicy, PolicyChoice
from hami.vendors import build_vendors

VENDORS = build_vendors()
SPREAD = PolicyChoice(node=NodePolicy.BINPACK, cards=(CardPolicy.SPREAD,))


def test_core_reason_is_the_fit_rule():
    assert core_reason(100, 40, 1, 70) is Reason.CARD_INSUFFICIENT_CORE
    assert core_reason(100, 0, 1, 100) is Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    assert core_reason(200, 50, 1, 100) is None  # deviceCoreScaling 2: no exclusivity
    assert core_reason(200, 150, 1, 100) is Reason.CARD_INSUFFICIENT_CORE
    assert core_reason(200, 200, 2, 0) is Reason.CARD_COMPUTE_UNITS_EXHAUSTED
    assert core_reason(100, 0, 0, 100) is None


def test_summary_gives_the_fits_reason_text():
    devs = [Device(f"g{i}", i, 2, 1000, 100, "NVIDIA-T4") for i in range(3)]
    usage = {"g0": DeviceUsage(2, 0, 0), "g1": DeviceUsage(1, 900, 10), "g2": DeviceUsage(1, 0, 10)}
    s = CardSummary.of(devs, usage, frozenset())
    need = Need(nums=1, mem=500, pct=0, cores=100, use_types=())
    assert need.misfit(s) == (
        "1/3 CardInsufficientCore, 1/3 CardInsufficientMemory, 1/3 CardTimeSlicingExhausted"
    )
    assert s.memo == {need: need.misfit(s)}


cards_st = st.lists(
    st.tuples(
        st.sampled_from([0, 50, 100, 200, 300]),  # devcore: deviceCoreScaling 0 .. 3
        st.integers(1, 4),  # split count
        st.integers(0, 4),  # used slots
        st.sampled_from([0, 25, 50, 100, 150, 200]),  # used cores
        st.sampled_from([0, 4000, 8000, 16000]),  # used MiB of 16000
        st.booleans(),  # healthy
    ),
    min_size=1,
    max_size=4,
)
request_st = st.tuples(
    # MiB (0: by percentage), percent of the card's memory (the vendor writes 100 when neither is given)
    st.integers(1, 3),
    st.sampled_from([0, 1000, 8000]),
    st.sampled_from([25, 50, 100]),
    st.sampled_from([0, 30, 100, 120]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cards_st, request_st)
def test_prefilter_never_refuses_what_the_fit_places(rows, request):
    devs, usage = [], {}
    for i, (devcore, count, used, usedcores, usedmem, health) in enumerate(rows):
        devs.append(Device(f"g{i}", i, count, 16000, devcore, "NVIDIA-T4", health=health))
        usage[f"g{i}"] = DeviceUsage(min(used, count), usedmem, min(usedcores, devcore))
    nums, mem, pct, cores = request
    r = ContainerRequest(
        "NVIDIA", nums, memreq=mem, mem_percentage=pct if not mem else PERCENTAGE_UNSET, coresreq=cores
    )
    containers = [ContainerSpec("c", ContainerKind.APP, (r,))]
    fit = fit_pod(
        containers,
        NodeView("n", {"NVIDIA": devs}, usage),
        vendors=VENDORS,
        selections={"NVIDIA": Selection()},
        policy=SPREAD,
    )
    ((need,),) = pod_needs(containers, {}).values()
    verdict = need.misfit(CardSummary.of(devs, usage, frozenset()))
    if fit.ok:
        assert verdict is None
    else:
        # A one-container pod without selection rules: the summary decides exactly as the fit does.
        assert verdict == fit.reason_text()

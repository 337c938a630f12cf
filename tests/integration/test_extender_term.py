"""API writes belong to one leadership term: a filter (or bind) in flight when the term ends writes nothing.

Why it matters: the next leader rebuilds its state from the pods' annotations; a placement the old
leader patched after that rebuild would be invisible to it until the pod event arrives, long enough
to hand the same card out twice.
"""

from __future__ import annotations

import threading

from hami import annotations as A
from kubefakes.apiserver import FakeApiServer
from scheduler_extender.runtime import TermGuard
from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, start_extender, wait_ready


async def test_a_filter_in_flight_when_leadership_ends_does_not_patch(
    fake_apiserver: FakeApiServer, session
) -> None:
    api = fake_apiserver
    api.store.create("nodes", gpu_node("node1", cards("n1", 2)))
    server = await start_extender(api)
    await wait_ready(server)
    ended = threading.Event()
    original = server.state.filter

    def decide_then_lose_leadership(pod, names):  # type: ignore[no-untyped-def]
        outcome = original(pod, names)
        # The term ends right after the decision, before the placement is written (on another
        # thread, as the leader elector's callback would run).
        threading.Thread(target=server.runtime._end_term, daemon=True).start()
        assert _wait(lambda: server.runtime.guard.token() is None)
        ended.set()
        return outcome

    server.state.filter = decide_then_lose_leadership  # type: ignore[method-assign]
    try:
        pod = create_pod(api, gpu_pod("late", mem=1000, cores=10))
        rv = pod["metadata"]["resourceVersion"]
        result = await Scheduler(session, server.url).filter(pod, ["node1"])
        assert ended.is_set()
        assert result["Error"] == (
            "leadership ended while this filter was running; the placement was not recorded and the pod "
            "will be filtered again by the new leader"
        )
        annotations = api.store.get("pods", "late", namespace="default")["metadata"].get("annotations") or {}
        assert A.ASSIGNED_NODE not in annotations and A.NVIDIA_ALLOCATED not in annotations
        assert api.store.get("pods", "late", namespace="default")["metadata"]["resourceVersion"] == rv
    finally:
        await server.stop()


def test_term_guard_refuses_writers_of_an_ended_term_and_waits_for_those_in_flight() -> None:
    guard = TermGuard()
    assert guard.token() is None
    first = guard.open()
    with guard.writing(first) as ok:
        assert ok
        closer = threading.Thread(target=guard.close)
        closer.start()
        assert _wait(lambda: guard.token() is None)  # new writers are refused at once ...
        with guard.writing(first) as late:
            assert not late
        closer.join(0.2)
        assert closer.is_alive()  # ... while close() waits for the write in flight
    closer.join(5)
    assert not closer.is_alive()
    second = guard.open()
    assert second != first
    with guard.writing(first) as stale, guard.writing(second) as fresh:
        assert (stale, fresh) == (False, True)


def _wait(predicate, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True

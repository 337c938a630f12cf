"""Pod events of the real extender that are not about success or failure of a verb: a scheduling policy
annotation the extender could not use (it falls back to the configured default) is reported on the pod
as a Warning event, so ``kubectl describe pod`` shows why the pod was not packed the way it asked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, eventually, start_extender, wait_ready

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler-extender.md"


def documented_rbac() -> set[tuple[str, str]]:
    """(verb, resource) pairs of the RBAC sentence in docs/scheduler-extender.md."""
    (sentence,) = re.findall(r"RBAC: (.*?)\. \|", DOC.read_text())
    pairs = set()
    for clause in sentence.split(";"):
        verbs = re.findall(r"`([a-z/]+)`", clause)[0].split("/")
        for resource in re.findall(r"\b(nodes|pods/binding|pods|resourcequotas|events|leases)\b", clause):
            pairs.update((v, resource) for v in verbs)
    return pairs


def _events(api: Any, pod: str) -> list[tuple[str, str, str, int]]:
    return [
        (e["reason"], e["type"], e["message"], e.get("count", 1))
        for e in api.store.list("events", namespace="default")
        if e["involvedObject"]["name"] == pod
    ]


async def test_unusable_policy_annotations_become_one_warning_event(fake_apiserver: Any, session) -> None:
    api = fake_apiserver
    api.store.create("nodes", gpu_node("node1", cards("a", 2)))
    server = await start_extender(api)
    try:
        await wait_ready(server)
        annotations = {
            "hami.io/node-scheduler-policy": "spreadd",
            "hami.io/gpu-scheduler-policy": "packed",
        }
        patches = api.faults.add(verb="patch", resource="events", status=None, times=1000)
        pod = create_pod(api, gpu_pod("p", mem=1000, cores=10, annotations=annotations))
        result = await Scheduler(session, server.url).filter(pod, ["node1"])
        assert result["NodeNames"] == ["node1"] and result["Error"] == ""
        await server.events.drain()
        (warning,) = [e for e in _events(api, "p") if e[0] == "SchedulingPolicyIgnored"]
        reason, kind, message, count = warning
        assert kind == "Warning" and count == 1
        parts = message.split("; using the default ")
        assert "unknown policy 'spreadd'" in parts[0] and parts[1].startswith("'binpack'")
        assert "'packed'" in message and message.endswith("'spread'")

        # The same warning again (kube-scheduler retries the pod) counts up the existing event.
        await Scheduler(session, server.url).filter(pod, ["node1"])
        await server.events.drain()
        await eventually(
            lambda: [e[3] for e in _events(api, "p") if e[0] == "SchedulingPolicyIgnored"] == [2],
            what="repeat counted on the one event",
        )
        # Counting repeats patches the Event: the documented RBAC must grant it.
        assert patches.hits >= 1
        assert {("create", "events"), ("patch", "events")} <= documented_rbac()
    finally:
        await server.stop()


async def test_valid_or_blank_policy_annotations_send_no_warning(fake_apiserver: Any, session) -> None:
    api = fake_apiserver
    api.store.create("nodes", gpu_node("node1", cards("a", 2)))
    server = await start_extender(api)
    try:
        await wait_ready(server)
        annotations = {"hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": " "}
        pod = create_pod(api, gpu_pod("ok", mem=1000, cores=10, annotations=annotations))
        result = await Scheduler(session, server.url).filter(pod, ["node1"])
        assert result["NodeNames"] == ["node1"]
        await server.events.drain()
        reasons = [e[0] for e in _events(api, "ok")]
        assert reasons == ["FilteringSucceed"]
    finally:
        await server.stop()


async def test_failed_nodes_in_the_filter_reply_say_what_the_event_says(fake_apiserver: Any, session) -> None:
    # kube-scheduler shows FailedNodes in the pod's FailedScheduling event: the same words as ours.
    api = fake_apiserver
    api.store.create("nodes", gpu_node("node1", cards("a", 1)))
    api.store.create("nodes", gpu_node("node2", cards("b", 1)))
    server = await start_extender(api)
    try:
        await wait_ready(server)
        sched = Scheduler(session, server.url)
        pod = create_pod(api, gpu_pod("two", gpus=2, mem=1000))
        result = await sched.filter(pod, ["node1", "node2"])
        words = "1/1 NodeInsufficientDevice (needs 2 distinct cards, node has 1)"
        assert result["NodeNames"] == [] and result["FailedNodes"] == {"node1": words, "node2": words}
        await server.events.drain()
        [(reason, kind, message, _)] = _events(api, "two")
        assert (reason, kind) == ("FilteringFailed", "Warning")
        assert message == f"no available node, 2 nodes do not meet: 2 nodes {words} (node1, node2)"
    finally:
        await server.stop()

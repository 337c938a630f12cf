"""Pod events (FilteringSucceed / FilteringFailed / BindingSucceed / BindingFailed / SchedulingPolicyIgnored)
sent off the request path.

An Event is an API write; waiting for it inside /filter or /bind would put an extra round trip on every
scheduling decision (and the filter path may make exactly one API call: the pod patch). So events go
into a bounded queue that a background task drains; when the API server is slow and the queue is
full, events are dropped and counted (`hami_scheduler_events_dropped_total`), as client-go's
broadcaster does - a scheduling decision is never delayed for an event.

The message texts are built here, once: HAMi's reason words and sentence shapes (hami-legacy-spec
§2.10), with failing nodes grouped by reason so `kubectl describe pod` shows one line per cause.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami.pods import ContainerSpec
from hami.reasons import humanize

log = logging.getLogger(__name__)

FILTERING_SUCCEED = "FilteringSucceed"
FILTERING_FAILED = "FilteringFailed"
BINDING_SUCCEED = "BindingSucceed"
BINDING_FAILED = "BindingFailed"
#: Warning: a scheduling policy annotation of the pod could not be used; the default applied instead.
POLICY_IGNORED = "SchedulingPolicyIgnored"
#: Warning on a Node: its device registration cannot be read, so the node is left out of scheduling.
INVALID_REGISTRATION = "InvalidRegistration"
#: The preempt verb's answer for a pending pod: per node, the pods whose eviction frees its cards.
PREEMPTION_PLANNED = "PreemptionPlanned"
#: Warning: no candidate node kube-scheduler offered has lower-priority pods whose eviction frees cards.
PREEMPTION_NOT_HELPFUL = "PreemptionNotHelpful"

#: `--events`: all (HAMi: every filter and bind), failures (Warning events only), none.
EVENT_LEVELS = ("all", "failures", "none")

#: Node names listed per reason group before "and N more".
MAX_NAMES = 5


def group_reasons(failed: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """Failed nodes grouped by reason text, biggest group first: [(reason, [node, ...]), ...]."""
    groups: dict[str, list[str]] = defaultdict(list)
    for node, reason in failed.items():
        groups[reason].append(node)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _names(nodes: list[str]) -> str:
    shown = ", ".join(sorted(nodes)[:MAX_NAMES])
    return shown + (f" and {len(nodes) - MAX_NAMES} more" if len(nodes) > MAX_NAMES else "")


def filtering_failed_message(failed: Mapping[str, str], *, containers: Sequence[ContainerSpec] = ()) -> str:
    """``no available node, 3 nodes do not meet: 2 nodes 2/2 CardInsufficientMemory (n1, n2); ...``.

    With the pod's `containers` each reason also gets its sentence (`hami.reasons.humanize`), e.g.
    ``1 node 1/1 NodeInsufficientDevice (needs 2 distinct cards, node has 1) (n1)``.
    """
    parts = [f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} {humanize(reason, containers) if containers else reason} "
             f"({_names(nodes)})" for reason, nodes in group_reasons(failed)]  # fmt: skip
    return f"no available node, {len(failed)} nodes do not meet: " + "; ".join(parts)


def failed_nodes_words(
    failed: Mapping[str, str], containers: Sequence[ContainerSpec]
) -> dict[str, str]:
    """`failed` (node -> the fit's reason text) with each reason's sentence (`hami.reasons.humanize`),
    as the filter reply's ``FailedNodes``: kube-scheduler puts that text into the pod's
    ``FailedScheduling`` event, so it says what this extender's own events and ``hami explain`` say.
    Each distinct text is worded once (a reply may name thousands of nodes and a handful of reasons)."""
    words = {reason: humanize(reason, containers) for reason in set(failed.values())} if containers else {}
    if all(text == reason for reason, text in words.items()):
        return dict(failed)  # nothing to add (no fit reasons, or no requests to word them by)
    return {node: words[reason] for node, reason in failed.items()}


def filtering_succeed_message(node: str, cards: list[str], not_chosen: int) -> str:
    """``find fit node(node1), cards GPU-a, GPU-b; 2 other candidate nodes not chosen``."""
    return f"find fit node({node}), cards {', '.join(cards) or 'none'}; {not_chosen} other candidate nodes not chosen"


def node_names(nodes: Sequence[str]) -> str:
    """Node names for a message, at most `MAX_NAMES` then "and N more"."""
    return _names(list(nodes))


def preemption_message(plans: Mapping[str, Any], left_out: Sequence[str]) -> str:
    """``victims on 2 nodes: n1: ml/a, ml/b; n2: ml/c; no room on n3`` (`plans`: node -> NodePlan);
    kube-scheduler picks one of the nodes and evicts its victims."""
    parts = []
    for node in sorted(plans)[:MAX_NAMES]:
        vs = plans[node].victims
        parts.append(f"{node}: " + ", ".join(f"{v.namespace}/{v.name}" if v.name else v.uid for v in vs))
    more = len(plans) - MAX_NAMES
    text = f"victims on {len(plans)} node{'s' if len(plans) != 1 else ''}: " + "; ".join(parts)
    if more > 0:
        text += f"; and {more} more nodes"
    if left_out:
        text += f"; no room on {_names(list(left_out))}"
    return text


def binding_succeed_message(node: str, namespace: str, name: str) -> str:
    """HAMi's text: ``Successfully binding node [node1] to default/gpu-pod``."""
    return f"Successfully binding node [{node}] to {namespace}/{name}"


class EventSink:
    """A bounded queue of events drained by one background task through `send`: a coroutine function
    awaited on the loop (`KubeClient.acreate_event`), or a blocking call run in a thread
    (`KubeClient.create_event`). `on_drop()` is called for every dropped event."""

    def __init__(
        self,
        send: Callable[..., Any] | None,
        *,
        component: str,
        capacity: int = 1000,
        on_drop: Callable[[], None] | None = None,
        level: str = "all",
    ) -> None:
        if level not in EVENT_LEVELS:
            raise ValueError(f"event level {level!r}: valid: {', '.join(EVENT_LEVELS)}")
        self._send = send if level != "none" else None
        # A coroutine function (`KubeClient.acreate_event`) runs on the loop; a blocking one in a thread.
        self._async_send = inspect.iscoroutinefunction(send)
        self.warnings_only = level == "failures"
        self.component = component
        self._queue: asyncio.Queue[tuple[dict[str, Any], dict[str, Any]]] = asyncio.Queue(capacity)
        self._on_drop = on_drop or (lambda: None)
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        if self._send is not None and self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name="event-sink")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def emit(self, involved: Mapping[str, Any], *, reason: str, message: str, warning: bool = False) -> None:
        """Queue one event about `involved` (a Pod dict or a stub with kind and metadata). Never blocks.

        Callable from any thread: the filter and bind work runs in worker threads, and an asyncio
        queue may only be touched from its loop's thread (else the drain task may not wake up).
        """
        if self._send is None or (self.warnings_only and not warning):
            return
        kwargs = {"reason": reason, "message": message, "type": "Warning" if warning else "Normal",
                  "component": self.component}  # fmt: skip
        item = (dict(involved), kwargs)
        loop = self._loop
        if loop is not None and not _in_loop(loop):
            try:
                loop.call_soon_threadsafe(self._put, item)
            except RuntimeError:  # the loop is closed: shutting down
                self._on_drop()
            return
        self._put(item)

    def _put(self, item: tuple[dict[str, Any], dict[str, Any]]) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self._on_drop()

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait until every queued event was handed to the API (tests)."""
        await asyncio.wait_for(self._queue.join(), timeout_s)

    async def _run(self) -> None:
        assert self._send is not None
        while True:
            involved, kwargs = await self._queue.get()
            try:
                if self._async_send:
                    await self._send(involved, **kwargs)
                else:
                    await asyncio.to_thread(self._send, involved, **kwargs)
            except Exception as e:  # noqa: BLE001 - an event is never worth a crash
                log.warning("event %s not recorded: %s", kwargs.get("reason"), e)
            finally:
                self._queue.task_done()


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def pod_ref(namespace: str, name: str, uid: str = "") -> dict[str, Any]:
    """A minimal involved-object stub for a pod known only by name (bind calls)."""
    meta = {"namespace": namespace, "name": name, **({"uid": uid} if uid else {})}
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta}

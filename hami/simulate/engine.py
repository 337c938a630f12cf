"""The replay: pods go through kube-scheduler's CPU/memory fit, then the extender's core, one by one.

Why a replay and not a model: every decision is made by `ClusterState.filter`, the function the
scheduler extender calls, on Pod and Node JSON shaped as in a cluster, so what the simulator reports is
what the extender would do. The simulator adds only what kube-scheduler does before calling the
extender (NodeResourcesFit on CPU, memory and pod count, tracked per node in
`hami.simulate.noderesources`) and, for pods without GPU requests (which never reach the extender),
kube-scheduler's default LeastAllocated choice.

This module drives a run: it checks the input, orders the events of each mode and takes the figures at
the end; one policy's state and every pod's way through kube-scheduler's fit and the extender's filter
are `hami.simulate.replay.Replay`.

Modes:
- ``trace``: arrivals at `creation_time` and deletions at `deletion_time`, in time order (a deletion
  at the same second as an arrival goes first); a deletion frees the pod through
  `ClusterState.remove_pod`, the extender's pod-removal path. A pod that fails is not retried.
- ``fill``: pods drawn with replacement (seeded) from the workload and submitted without departures
  until the arrived GPU demand reaches `arrival` percent of the cluster's GPU capacity (FGD paper,
  Weng et al., ATC'23). Every policy sees the same sequence of pods for the same seed.
"""

from __future__ import annotations

import gc
import heapq
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hami.cluster import ClusterState
from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate.allocation import card_figures, families
from hami.simulate.replay import Replay
from hami.simulate.results import (
    Checkpoint,
    Mode,
    ModelUsage,
    Placement,
    Policy,
    Progress,
    RunResult,
    parse_policy,
    summarise_failure,
    summarise_reasons,
)
from hami.simulate.workload import SimPod, Workload


def _config_for(config: DeviceConfig, policy: Policy) -> DeviceConfig:
    return replace(
        config,
        scheduler=replace(config.scheduler, nodeSchedulerPolicy=policy.node, gpuSchedulerPolicy=policy.card),
    )


def card_allocation(state: ClusterState) -> tuple[float, float, dict[str, ModelUsage]]:
    """(GPU ratio by cores, memory ratio, per model) from `ClusterState.card_stats()`: the core's own
    view, which the engine's incremental figures must equal (tests hold that;
    `hami.simulate.allocation.card_figures` gives every figure)."""
    figures, per_model, _ = card_figures(state, families(state.vendors))
    return figures.cores, figures.memory, per_model


def run(
    workload: Workload,
    *,
    config: DeviceConfig,
    policy: Policy,
    mode: Mode = Mode.FILL,
    arrival: float = 130.0,
    seed: int = 0,
    placements: bool = False,
    annotations: bool = False,
    curve_step: float = 1.0,
    progress: Progress | None = None,
    placed: Sequence[tuple[str, SimPod]] = (),
    max_pods: int | None = None,
    stop_at_failure: bool = False,
    queue: Any = None,
) -> RunResult:
    """Replay `workload` under `policy` and return the figures (and the placements and the extender's
    annotations per scheduled GPU pod, when asked; `hami.io/vgpu-time` is the trace time in trace mode
    and the submission number in fill mode, so outputs are reproducible).

    `arrival` (percent of GPU capacity, > 0) is the fill target. Checkpoints are taken at every 10 % of
    arrived demand, curve points (for plots) every `curve_step` % in fill mode and at 500 evenly spaced
    events in trace mode. `gpu_allocation_ratio` etc. are the state at the end; the `peak_*` fields the
    highest GPU allocation seen (what trace mode is about: at its end every pod has left).
    `placed` (node name, pod) are on their nodes before the first arrival (`Replay.keep`); arrivals
    count only the pods submitted. Fill mode also stops after `max_pods` submissions, and with
    `stop_at_failure` after the first pod that does not fit (the what-if of `hami.simulate.whatif`).
    `queue` (trace mode, `hami.simulate.priority.PendingQueue`): pods that do not fit wait for room,
    in priority order, and may preempt lower-priority pods; its report holds the waits and evictions.
    Raises InvalidRequest when the input cannot be replayed in `mode`: no GPU in the cluster; fill mode
    without a GPU pod; trace mode with pods that have no creation time.
    """
    if not any(n.cards for n in workload.nodes):
        raise InvalidRequest("the cluster has no GPU: nothing to simulate (check the nodes file)")
    if not any(c.devcore > 0 for n in workload.nodes for c in n.cards):
        # Capacity (and every arrival in percent of it) is counted in cores.
        raise InvalidRequest("every card registers devcore 0: the cluster's GPU capacity is 0")
    cfg = _config_for(config, policy)
    result = RunResult(
        policy=policy,
        mode=mode,
        arrival_target=arrival if mode is Mode.FILL else None,
        seed=seed,
        nodes=len(workload.nodes),
        gpus=workload.gpus,
        placements=[] if placements else None,
        annotations=[] if annotations else None,
    )
    if mode is Mode.FILL:
        if not any(p.is_gpu for p in workload.pods):
            raise InvalidRequest("fill mode needs at least one GPU pod in the workload")
        if not arrival > 0:
            raise InvalidRequest(f"--arrival: {arrival:g} must be a percent > 0")
    else:
        missing = [p.name for p in workload.pods if p.creation_time is None]
        if missing:
            raise InvalidRequest(
                f"--mode trace needs a creation time for every pod; {len(missing)} pods have none "
                f"(first: {missing[0]}); use --mode fill for pod lists without times"
            )
    replay = Replay(workload, cfg, result, curve_step if mode is Mode.FILL else float("inf"), placed)
    replay.queue = queue
    # The workload and the state built so far live through the run: out of the collector's sight, a
    # full collection (which a replay of many pods sets off now and then) walks only what the replay
    # adds. Only when no caller froze objects itself, so unfreezing at the end gives back just these.
    froze = gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    started = time.perf_counter()
    if mode is Mode.FILL:
        rng = random.Random(seed)
        target = arrival / 100 * replay.capacity
        # A pod already placed counts as the first of its name: a draw of the running `a` is `a-2`, so
        # no output row reads as a second placement of the running pod.
        drawn: Counter[str] = Counter(p.name for _, p in placed)
        pool = workload.pods
        # A second draw of `a` is `a-2`, unless the input has its own `a-2`: then `a~2`, so that every
        # row of the outputs names one pod.
        given = {p.name for p in pool} | {p.name for _, p in placed}
        seq = 0
        while replay.arrived < target and (max_pods is None or seq < max_pods):
            pod = pool[rng.randrange(len(pool))]
            drawn[pod.name] += 1
            k = drawn[pod.name]
            name = pod.name
            if k > 1:
                name = f"{pod.name}-{k}" if f"{pod.name}-{k}" not in given else f"{pod.name}~{k}"
            replay.stamp = float(seq)
            replay.submit(pod, f"sim-{seq}", name)
            seq += 1
            if stop_at_failure and result.failed:
                break
            if pod.is_gpu:
                replay.sample()
                if progress is not None and seq % 32 == 0:
                    progress(min(1.0, replay.arrived / target))
    else:
        # (time, kind, pod index): at one second, deletions (0) free capacity before arrivals (1); a pod
        # deleted in the second it arrived leaves after the arrivals (2).
        events: list[tuple[float, int, int]] = []
        for k, p in enumerate(workload.pods):
            created = p.creation_time or 0.0
            events.append((created, 1, k))
            if p.deletion_time is not None:
                events.append((p.deletion_time, 2 if p.deletion_time <= created else 0, k))
        heapq.heapify(events)
        total = len(events)
        every = max(1, total // 500)
        # The plot's curve: per bucket of `every` events, its lowest and its highest point in time order
        # (the envelope: a peak between two samples is not lost), plus the very first event (the curve
        # starts where the trace does, however sparse its beginning).
        low = high = None
        for done in range(1, total + 1):
            replay.now, kind, k = heapq.heappop(events)
            replay.stamp = replay.now
            pod = workload.pods[k]
            if kind == 1:
                replay.submit(pod, f"sim-{k}", pod.name)
            else:
                replay.delete(f"sim-{k}")
            replay.sample()
            g = replay.usage.ratios().capacity
            if done == 1:
                result.curve.append(replay.point(round(replay.arrived_pct, 3)))
            elif low is None or g < low.capacity_allocation_ratio or g > high.capacity_allocation_ratio:
                point = replay.point(round(replay.arrived_pct, 3))
                if low is None:
                    low = high = point
                elif g < low.capacity_allocation_ratio:
                    low = point
                else:
                    high = point
            if (done % every == 0 or done == total) and low is not None:
                result.curve.extend(sorted({id(p): p for p in (low, high)}.values(), key=lambda p: p.time))
                low = high = None
            last = result.curve[-1]
            if done == total and (last.time, last.capacity_allocation_ratio) != (replay.now, g):
                result.curve.append(replay.point(round(replay.arrived_pct, 3)))
            if progress is not None and done % 32 == 0:
                progress(done / total)
    if queue is not None:
        queue.finish(replay)  # pods still waiting at the end are the run's failures
    result.elapsed_s = time.perf_counter() - started
    if froze:
        gc.unfreeze()
    result.arrived_gpu_demand = replay.arrived_pct
    f = replay.usage.ratios()
    result.gpu_allocation_ratio, result.memory_allocation_ratio = f.cores, f.memory
    result.slot_allocation_ratio, result.capacity_allocation_ratio = f.slots, f.capacity
    result.per_model = replay.usage.per_model()
    result.per_family = replay.usage.per_family()
    if not result.peak_per_model:
        result.peak_per_model, result.peak_per_family = result.per_model, result.per_family
    if mode is Mode.FILL and (not result.curve or result.curve[-1].arrival < result.arrived_gpu_demand):
        replay.now = None
        result.curve.append(replay.point(round(result.arrived_gpu_demand, 3)))
    if progress is not None:
        progress(1.0)
    replay.node_figures()
    result.state = replay.state
    return result


__all__ = (
    "Checkpoint",
    "Mode",
    "ModelUsage",
    "Placement",
    "Policy",
    "Progress",
    "RunResult",
    "parse_policy",
    "summarise_failure",
    "summarise_reasons",
    "card_allocation",
    "run",
)

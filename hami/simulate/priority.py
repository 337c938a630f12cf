"""Priorities in `hami simulate`: where the pods' priorities come from, a pending queue in kube-scheduler's
order, and preemption through the extender's own victim choice.

Why a queue: without priorities a trace replay refuses a pod that does not fit at its arrival, and
that refusal is the figure. With priorities the question is how long the important pods wait and what
evicting others costs, so a pod that does not fit waits, as in kube-scheduler's queue, and is tried
again, highest priority first (then in arrival order), whenever a pod leaves. With `--preemption on` a
pod that does not fit at its arrival preempts: the extender's plans (`ClusterState.plan_preemption`,
every node with lower-priority pods a candidate, as kube-scheduler asks with node totals counted or
empty candidates) and kube-scheduler's choice of node (`hami.preemption.pick_node`); the victims are
evicted at once (graceful termination is not replayed), go back to the queue as their controller
would recreate them, and end at their own trace deletion time. A pod still waiting when the trace
ends, or deleted while waiting, is reported as never placed (its wait is counted up to then).

Priority sources (`--priorities`):
- ``qos`` or ``qos:LS=1000,BE=0,...``: the openb pod CSV's ``qos`` column mapped to priorities
  (default LS and Guaranteed 1000, Burstable 500, BE 0; other values 0);
- ``mix:PCT``: PCT % of the GPU pods, drawn with the run's seed, get priority 1000, the others 0;
- not given: each pod's own ``spec.priority`` (Kubernetes YAML), else 0.
"""

from __future__ import annotations

import csv
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hami.errors import InvalidRequest
from hami.preemption import pick_node, pod_priority
from hami.simulate.workload import SimPod, Workload

#: The openb `qos` values and their priorities when `--priorities qos` names no map.
DEFAULT_QOS = {"LS": 1000, "Guaranteed": 1000, "Burstable": 500, "BE": 0}
#: The priority of the drawn share with `--priorities mix:PCT`.
MIX_HIGH = 1000
PREEMPTION_MODES = ("off", "on")


def _with_priority(pod: SimPod, priority: int) -> SimPod:
    obj = {**pod.obj, "spec": {**pod.obj["spec"], "priority": priority}}
    return replace(pod, obj=obj)


def parse_qos_map(spec: str) -> dict[str, int]:
    """``LS=1000,BE=0`` -> {"LS": 1000, "BE": 0}. Raises InvalidRequest naming the entry."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, sep, value = (x.strip() for x in part.partition("="))
        v = value.lstrip("-")
        if not sep or not name or not (v.isascii() and v.isdigit()):
            raise InvalidRequest(
                f"--priorities qos:{spec}: {part.strip()!r} must be QOS=INTEGER, e.g. LS=1000"
            )
        out[name] = int(value)
    return out


def assign(workload: Workload, spec: str | None, *, pods_file: str | None, seed: int) -> Workload:
    """The workload with the pods' `spec.priority` set from `spec` (see the module doc); unchanged for
    None. Raises InvalidRequest naming the flag and the valid forms."""
    if spec is None:
        return workload
    s = spec.strip()
    if s == "qos" or s.startswith("qos:"):
        mapping = parse_qos_map(s[4:]) if s.startswith("qos:") else DEFAULT_QOS
        if pods_file is None or not pods_file.lower().endswith(".csv"):
            raise InvalidRequest(
                "--priorities qos: reads the qos column of an openb pod CSV; give --pods FILE.csv"
            )
        qos = _qos_column(pods_file)
        return replace(
            workload, pods=[_with_priority(p, mapping.get(qos.get(p.name, ""), 0)) for p in workload.pods]
        )
    if s.startswith("mix:"):
        raw = s[4:].strip().rstrip("%")
        try:
            pct = float(raw)
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise InvalidRequest(f"--priorities {spec}: want mix:PCT with 0 < PCT <= 100, e.g. mix:20")
        rng = random.Random(seed)
        pods = [
            _with_priority(p, MIX_HIGH if p.is_gpu and rng.random() * 100 < pct else 0) for p in workload.pods
        ]
        return replace(workload, pods=pods)
    raise InvalidRequest(f"--priorities {spec!r}: want qos, qos:QOS=PRIORITY,... or mix:PCT (e.g. mix:20)")


def _qos_column(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = csv.reader(f)
            header = [h.strip() for h in next(rows, [])]
            if "qos" not in header or "name" not in header:
                raise InvalidRequest(
                    f"--priorities qos: {path} has no qos column (columns: {', '.join(header)})"
                )
            qi, ni = header.index("qos"), header.index("name")
            return {r[ni].strip(): r[qi].strip() for r in rows if len(r) > max(qi, ni)}
    except OSError as e:
        raise InvalidRequest(f"--priorities qos: cannot read {path}: {e.strerror}") from None


# -- the queue ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ClassFigures:
    """One priority's figures: waits in seconds of the pods placed (0 when placed at arrival)."""

    pods: int = 0
    placed: int = 0
    never_placed: int = 0
    evicted: int = 0
    waits: list[float] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        w = sorted(self.waits)
        return {
            "pods": self.pods,
            "placed": self.placed,
            "never_placed": self.never_placed,
            "evicted": self.evicted,
            "waited": sum(1 for x in w if x > 0),
            "wait_mean_s": round(statistics.fmean(w), 3) if w else None,
            "wait_p50_s": round(_quantile(w, 0.5), 3) if w else None,
            "wait_p95_s": round(_quantile(w, 0.95), 3) if w else None,
            "wait_max_s": round(w[-1], 3) if w else None,
        }


def _secs(x: float) -> str:
    return f"{x:.1f} s" if x < 100 else f"{x:,.0f} s"


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list."""
    k = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.999999) - 1))
    return sorted_values[k]


@dataclass(slots=True)
class PriorityReport:
    """A run's figures per priority, and the preemptions (`preemptions`: pods placed by evicting
    `evictions` pods)."""

    preemption: bool
    classes: dict[int, ClassFigures] = field(default_factory=dict)
    preemptions: int = 0
    evictions: int = 0

    def json(self) -> dict[str, Any]:
        return {
            "preemption": "on" if self.preemption else "off",
            "preemptions": self.preemptions,
            "evictions": self.evictions,
            "classes": {str(p): c.json() for p, c in sorted(self.classes.items(), reverse=True)},
        }

    def text(self, label: str) -> list[str]:
        lines = [
            f"priorities ({label}, preemption {'on' if self.preemption else 'off'}): "
            f"{self.preemptions} pods placed by preempting, {self.evictions} evictions"
        ]
        for prio, c in sorted(self.classes.items(), reverse=True):
            j = c.json()
            wait = (
                "no pod placed"
                if j["wait_mean_s"] is None
                else f"{j['waited']} waited; wait mean {_secs(j['wait_mean_s'])}, p95 {_secs(j['wait_p95_s'])}, "
                f"max {_secs(j['wait_max_s'])}"
            )
            lines.append(
                f"  priority {prio}: {c.pods} pods, {c.placed} placed, {c.never_placed} never placed, "
                f"{c.evicted} evicted; {wait}"
            )
        return lines


@dataclass(slots=True)
class _Waiting:
    pod: SimPod
    uid: str
    name: str
    since: float
    seq: int
    priority: int
    reason: str = ""
    category: str = ""


class PendingQueue:
    """The engine's hook (`engine.run(queue=...)`, trace mode): waiting pods, placements, preemption.

    Figures per priority: `pods` distinct pods, `placed` those placed at least once, `never_placed`
    those that never were (still waiting at the end, or deleted while waiting: the run's failures),
    `evicted` evictions, and one wait per placement (an evicted pod waits again).
    """

    def __init__(self, *, preemption: bool) -> None:
        self.report = PriorityReport(preemption=preemption)
        self._waiting: dict[str, _Waiting] = {}
        self._running: dict[
            str, tuple[int, int, str, SimPod]
        ] = {}  # uid -> (node index, priority, name, pod)
        self._seen: set[str] = set()
        self._ever_placed: set[str] = set()
        self._seq = 0
        self._busy = False  # inside a retry pass or a preemption: no nested passes

    def _figures(self, priority: int) -> ClassFigures:
        c = self.report.classes.get(priority)
        if c is None:
            c = self.report.classes[priority] = ClassFigures()
        return c

    def _arrive(self, uid: str, priority: int) -> None:
        if uid not in self._seen:
            self._seen.add(uid)
            self._figures(priority).pods += 1

    def _enqueue(self, pod: SimPod, uid: str, name: str, now: float, reason: str, category: str) -> _Waiting:
        self._seq += 1
        w = self._waiting[uid] = _Waiting(
            pod, uid, name, now, self._seq, pod_priority(pod.obj), reason, category
        )
        return w

    # -- hooks --------------------------------------------------------------------------------------

    def wait(self, replay: Any, pod: SimPod, uid: str, name: str, reason: str, category: str) -> bool:
        """A pod found no room: it waits (True). At its arrival it may first preempt."""
        w = self._waiting.get(uid)
        if w is not None:
            w.reason, w.category = reason, category
            return True
        self._arrive(uid, pod_priority(pod.obj))
        w = self._enqueue(pod, uid, name, replay.now or 0.0, reason, category)
        if self.report.preemption and not self._busy and pod.is_gpu:
            self._preempt(replay, w)
        return True

    def placed(self, replay: Any, pod: SimPod, uid: str, name: str) -> None:
        prio = pod_priority(pod.obj)
        self._arrive(uid, prio)
        w = self._waiting.pop(uid, None)
        c = self._figures(prio)
        if uid not in self._ever_placed:
            self._ever_placed.add(uid)
            c.placed += 1
        else:
            replay.result.scheduled -= 1  # an evicted pod placed again is still one scheduled pod
        c.waits.append(0.0 if w is None else max(0.0, (replay.now or 0.0) - w.since))
        self._running[uid] = (replay.where[uid][0], prio, name, pod)

    def gone(self, replay: Any, uid: str) -> None:
        """A pod deleted while waiting (its trace deletion came first)."""
        w = self._waiting.pop(uid, None)
        if w is not None and uid not in self._ever_placed:
            self._figures(w.priority).never_placed += 1
            replay.fail(w.pod, w.name, w.reason, w.category)

    def freed(self, replay: Any, uid: str) -> None:
        """Pod `uid` left its node: try the waiting pods again, highest priority first, then in arrival
        order; after a pod of one shape fails, the later ones of that shape are not tried in this pass."""
        self._running.pop(uid, None)
        if self._busy or not self._waiting:
            return
        self._busy = True
        try:
            failed_shapes: set[int] = set()
            for w in sorted(self._waiting.values(), key=lambda w: (-w.priority, w.seq)):
                shape = id(w.pod)
                if w.uid not in self._waiting or shape in failed_shapes:
                    continue
                replay.place(w.pod, w.uid, w.name)
                if w.uid in self._waiting:
                    failed_shapes.add(shape)
        finally:
            self._busy = False

    def finish(self, replay: Any) -> None:
        """The trace ended: pods that waited from their arrival on are the run's failures."""
        for w in sorted(self._waiting.values(), key=lambda w: w.seq):
            if w.uid not in self._ever_placed:
                self._figures(w.priority).never_placed += 1
                replay.fail(w.pod, w.name, w.reason, w.category)
        self._waiting.clear()

    # -- preemption ------------------------------------------------------------------------------------

    def _preempt(self, replay: Any, w: _Waiting) -> None:
        lower = sorted({i for (i, p, _, _) in self._running.values() if p < w.priority})
        if not lower:
            return
        res = replay.res
        meta = w.pod.obj["metadata"]
        obj = {**w.pod.obj, "metadata": {**meta, "uid": w.uid, "name": w.name}}
        plans = replay.state.plan_preemption(obj, dict.fromkeys(res.names[i] for i in lower))
        # kube-scheduler's own filter: the pod's CPU and memory must fit once the victims are gone.
        fitting = {}
        for node, plan in plans.items():
            i = res.index[node]
            going = [self._running[v.uid][3] for v in plan.victims if v.uid in self._running]
            cpu = res.cpu[i] + sum(p.cpu_milli for p in going)
            mem = res.mem[i] + sum(p.memory_mib for p in going)
            if res.open[i] and cpu >= w.pod.cpu_milli and mem >= w.pod.memory_mib:
                fitting[node] = plan
        best = pick_node(fitting)
        if best is None:
            return
        self._busy = True
        try:
            for v in best.victims:
                self._evict(replay, v.uid)
            replay.place(w.pod, w.uid, w.name)
        finally:
            self._busy = False
        if w.uid not in self._waiting:
            self.report.preemptions += 1
        self.freed(replay, "")  # the evicted pods may fit elsewhere

    def _evict(self, replay: Any, uid: str) -> None:
        running = self._running.pop(uid, None)
        if running is None or not replay.remove(uid):
            return
        _, prio, name, pod = running
        self.report.evictions += 1
        self._figures(prio).evicted += 1
        # Its controller creates it again: it waits from now on, like any pod that does not fit.
        self._enqueue(pod, uid, name, replay.now or 0.0, "evicted by a pod of higher priority", "evicted")


def check_mode(priorities: str | None, preemption: str | None, *, trace: bool) -> bool:
    """Whether the run replays priorities; raises InvalidRequest for the flags outside trace mode or
    an unknown `--preemption` value."""
    if preemption is not None and preemption not in PREEMPTION_MODES:
        raise InvalidRequest(f"--preemption {preemption!r}: want on or off")
    wanted = priorities is not None or preemption is not None
    if wanted and not trace:
        flag = "--priorities" if priorities is not None else "--preemption"
        raise InvalidRequest(f"{flag}: only with --mode trace (waiting times need the trace's clock)")
    return wanted


def priority_json(reports: Mapping[str, PriorityReport]) -> dict[str, Any]:
    return {label: r.json() for label, r in reports.items()}

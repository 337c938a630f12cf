"""`hami simulate --what-if-shape`: how many more pods of one shape fit under each policy than under mine.

Why: the operator's question about a live cluster is rarely "what is the allocation ratio" but "if a
burst of pods like *this* arrives now, how many get a card, and would another policy make room for
more?". The answer is counted, not estimated: from the start state (the cluster as it is,
`hami.simulate.start`), pods of the shape are submitted one after another through the same path as a
replay's arrivals (kube-scheduler's CPU/memory/pod-count fit, then the extender's filter and
reservation: `hami.simulate.engine.run`) until the first one fits nowhere. Pods of one shape that
follow a refused one would be refused too (nothing was freed), so the count stops there. Each policy
starts from the same state; the difference is taken against the *current* policy (the device config's
``nodeSchedulerPolicy``/``gpuSchedulerPolicy``, or ``--current-policy``).

Shape grammar: ``NAME=QUANTITY`` entries joined by ``,``, with NAME ``cpu``, ``memory`` or a resource name
of an enabled vendor (``nvidia.com/gpu``, ``nvidia.com/gpumem``, ``nvidia.com/gpumem-percentage``,
``nvidia.com/gpucores``, ...), e.g. ``nvidia.com/gpu=1,nvidia.com/gpumem=8000,nvidia.com/gpucores=30,cpu=4``.
The shape is one container: the device resources as its limits, ``cpu``/``memory`` as its requests. It
goes through the webhook's mutation like any pod of a YAML file (defaults filled in), so
``nvidia.com/gpu=1`` alone asks for a whole card, as in the cluster.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import yaml

from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.quantity import parse_quantity
from hami.simulate import kubeyaml
from hami.simulate.engine import Mode, Policy, parse_policy, run
from hami.simulate.report import cluster_line
from hami.simulate.start import Start
from hami.simulate.workload import DEFAULT_NAMESPACE, SimNode, SimPod, TraceError, Workload
from hami.tools.table import table
from hami.vendors import build_vendors

FLAG = "--what-if-shape"

#: Most pods of one shape submitted per policy: past it the count is reported as "at least" (`capped`).
MAX_PODS = 100_000

#: The shape's pod and container names (the outputs name the n-th pod ``what-if-n``).
POD_NAME = "what-if"
CONTAINER = "main"

#: Pod-level resources kube-scheduler fits; everything else must be a vendor's resource name.
HOST_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True, slots=True)
class Shape:
    """One parsed ``--what-if-shape``: its text as given (entries trimmed) and the pod it stands for."""

    text: str
    pod: SimPod


def resource_names(config: DeviceConfig) -> list[str]:
    """The names a shape may use: ``cpu``, ``memory``, then every enabled vendor's resources."""
    names = list(HOST_RESOURCES)
    for vendor in build_vendors(config).values():
        names.extend(n for n in vendor.resource_names().all() if n not in names)
    return names


def parse_shape(text: str, *, config: DeviceConfig) -> Shape:
    """A shape as the CLI writes it (see the module docstring).

    Raises InvalidRequest naming ``--what-if-shape``, the entry and the valid names or the quantity rule:
    an empty shape, an entry without ``=``, an unknown or repeated name, a quantity Kubernetes would not
    accept or a negative one, or a shape that asks for no device.
    """
    valid = resource_names(config)
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise InvalidRequest(
            f"{FLAG}: empty shape; e.g. {FLAG} nvidia.com/gpu=1,nvidia.com/gpumem=8000,cpu=4"
        )
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    for entry in entries:
        name, sep, value = (x.strip() for x in entry.partition("="))
        if not sep or not name or not value:
            raise InvalidRequest(f"{FLAG}: {entry!r} must be NAME=QUANTITY, e.g. nvidia.com/gpumem=8000")
        if name not in valid:
            raise InvalidRequest(f"{FLAG}: {name!r} is not a resource name; valid: {', '.join(valid)}")
        if name in limits or name in requests:
            raise InvalidRequest(f"{FLAG}: {name} given twice")
        try:
            number, _ = parse_quantity(value, resource=name)
        except InvalidRequest as e:
            raise InvalidRequest(f"{FLAG}: {e}") from None
        if number < 0:
            raise InvalidRequest(f"{FLAG}: {name}={value} must not be negative")
        (requests if name in HOST_RESOURCES else limits)[name] = value
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD_NAME, "namespace": DEFAULT_NAMESPACE},
        "spec": {
            "schedulerName": config.scheduler.schedulerName,
            "containers": [{"name": CONTAINER, "resources": resources}],
        },
    }
    try:
        (loaded,) = kubeyaml.load_pods(FLAG, config=config, text=yaml.safe_dump(pod, sort_keys=False))
    except TraceError as e:
        # The loader names a file line and the pod; here the flag's value is the input.
        why = e.message.removeprefix(f"Pod {POD_NAME}: container {CONTAINER}: ")
        raise InvalidRequest(f"{FLAG}: {text.strip()!r}: {why}") from None
    if not loaded.is_gpu:
        device = next((n for n in valid if n not in HOST_RESOURCES), "nvidia.com/gpu")
        raise InvalidRequest(f"{FLAG}: {text.strip()!r} asks for no device; add a count such as {device}=1")
    return Shape(",".join(entries), loaded)


def pod_cap(nodes: Sequence[SimNode]) -> int:
    """How many pods of any device-asking shape could ever be placed, plus one (so that the last one is
    refused), at most `MAX_PODS`: every such pod takes a card slot and a pod slot of its node."""
    slots = sum(c.count for n in nodes for c in n.cards)
    pod_slots = sum(n.max_pods for n in nodes if n.cards)
    return min(slots, pod_slots, MAX_PODS - 1) + 1


@dataclass(frozen=True, slots=True)
class Outcome:
    """One policy's count: `fit` pods placed before the first refusal (`stopped_by`: its reason
    category), or before the cap (`capped`); allocation ratios 0..1 after them."""

    policy: Policy
    fit: int
    capped: bool
    stopped_by: str | None
    gpu_allocation_ratio: float
    memory_allocation_ratio: float
    #: The cards' capacity taken after them (per card the largest of cores, memory and slots).
    capacity_allocation_ratio: float = 0.0


@dataclass(frozen=True, slots=True)
class ShapeAnswer:
    """Every policy's count for one shape; `current` is the label of the reference policy."""

    shape: Shape
    cap: int
    current: str
    outcomes: list[Outcome]

    def difference(self, o: Outcome) -> int:
        """Pods more (negative: fewer) than under the current policy."""
        base = next(x.fit for x in self.outcomes if x.policy.label == self.current)
        return o.fit - base


def what_if(
    nodes: Sequence[SimNode],
    placed: Sequence[tuple[str, SimPod]],
    shape: Shape,
    *,
    config: DeviceConfig,
    policies: Sequence[Policy],
    current: Policy,
    nodes_source: str = "",
    done: Callable[[Outcome, float], None] | None = None,
) -> ShapeAnswer:
    """Count, for `current` and each of `policies`, the pods of `shape` that fit from the start state
    `placed` (see the module docstring); `done(outcome, seconds)` is called after each policy.
    Raises InvalidRequest when the cluster has no GPU."""
    order = [current, *(p for p in policies if p.label != current.label)]
    cap = pod_cap(nodes)
    workload = Workload(nodes=list(nodes), pods=[shape.pod], nodes_source=nodes_source, pods_source=FLAG)
    outcomes = []
    for policy in order:
        r = run(workload, config=config, policy=policy, mode=Mode.FILL, arrival=float("inf"), placed=placed,
                max_pods=cap, stop_at_failure=True)  # fmt: skip
        stopped = r.failure_reasons.most_common(1)[0][0] if r.failed else None
        outcomes.append(
            Outcome(
                policy,
                r.scheduled,
                r.failed == 0,
                stopped,
                r.gpu_allocation_ratio,
                r.memory_allocation_ratio,
                r.capacity_allocation_ratio,
            )  # fmt: skip
        )
        if done is not None:
            done(outcomes[-1], r.elapsed_s)
    return ShapeAnswer(shape, cap, current.label, outcomes)


def answers_json(
    answers: Sequence[ShapeAnswer], *, start: Start, nodes: Sequence[SimNode], nodes_source: str
) -> dict[str, Any]:
    """The object ``--json`` prints with ``--what-if-shape`` (docs/simulate.md lists the fields)."""
    return {
        "nodes_source": nodes_source,
        "nodes": len(nodes),
        "gpus": sum(len(n.cards) for n in nodes),
        "start": start.json(),
        "current_policy": answers[0].current if answers else None,
        "what_if": [
            {
                "shape": a.shape.text,
                "cap": a.cap,
                "policies": {
                    o.policy.label: {
                        "node_policy": o.policy.node,
                        "card_policy": o.policy.card,
                        "fit": o.fit,
                        "vs_current": a.difference(o),
                        "capped": o.capped,
                        "stopped_by": o.stopped_by,
                        "capacity_allocation_ratio": round(o.capacity_allocation_ratio, 6),
                        "gpu_allocation_ratio": round(o.gpu_allocation_ratio, 6),
                        "memory_allocation_ratio": round(o.memory_allocation_ratio, 6),
                    }
                    for o in a.outcomes
                },
            }
            for a in answers
        ],
    }


def answers_text(
    answers: Sequence[ShapeAnswer], *, start: Start, nodes: Sequence[SimNode], nodes_source: str,
    current_from: str,
) -> str:  # fmt: skip
    """The human summary: the start state, then per shape one row per policy."""
    lines = [
        "hami simulate - what-if: pods of one shape submitted one after another until one fits nowhere",
        cluster_line(nodes, nodes_source),
        start.text(),
        f"current policy: {answers[0].current} ({current_from})",
    ]
    for a in answers:
        lines += ["", f"shape {a.shape.text}:"]
        header = ["policy", "pods fit", "vs current", "capacity", "cores", "memory", "stopped by"]
        rows = []
        for o in a.outcomes:
            diff = a.difference(o)
            vs = "(current)" if o.policy.label == a.current else f"{diff:+d}"
            fit = f">={o.fit}" if o.capped else str(o.fit)
            stopped = f"cap of {a.cap} pods" if o.capped else (o.stopped_by or "-")
            rows.append([o.policy.label, fit, vs, f"{o.capacity_allocation_ratio * 100:.2f}%",
                         f"{o.gpu_allocation_ratio * 100:.2f}%", f"{o.memory_allocation_ratio * 100:.2f}%",
                         stopped])  # fmt: skip
        # text columns (policy, stopped by) left, the counts and ratios right
        lines += table(header, rows, left=(0, -1), rule=True)
    lines += [
        "",
        "pods fit: pods of the shape placed from the start state before the first refusal; vs current: "
        "pods more (+) or fewer (-) than the current policy; capacity: the cards' capacity taken after them "
        "(per card the largest of cores, memory and slots); cores/memory: of all cards after them; "
        "stopped by: the first refused pod's most common reason",
    ]
    return "\n".join(lines)


def current_policy(spec: str | None, config: DeviceConfig) -> tuple[Policy, str]:
    """(the reference policy, where it came from): `spec` (``--current-policy``, the `--policy` grammar),
    else the device config's policies. Raises InvalidRequest naming the flag and the valid policies."""
    sched = config.scheduler
    if spec is not None:
        if not spec.strip():
            raise InvalidRequest("--current-policy: empty value; e.g. --current-policy binpack/spread")
        return parse_policy(
            spec, default_node=sched.nodeSchedulerPolicy, flag="--current-policy"
        ), "--current-policy"
    card = sched.gpuSchedulerPolicy.replace(",", "+")
    return parse_policy(
        f"{sched.nodeSchedulerPolicy}/{card}", flag="--config"
    ), "the config's scheduler policies"


def run_what_if(
    args: argparse.Namespace,
    config: DeviceConfig,
    workload: Workload,
    placed: Sequence[tuple[str, SimPod]],
    policies: Sequence[Policy],
    *,
    start: Start,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """`hami simulate --what-if-shape ...`: parse every shape, count, print text or `--json` on `stdout`
    (with ``--progress`` a line per policy on `stderr`); returns 0.
    Raises InvalidRequest for a bad shape or policy, or a flag that has no meaning here."""
    for flag, given in (
        ("--mode trace", args.mode == Mode.TRACE.value),
        ("--arrival", args.arrival is not None),
        ("--placements", args.placements is not None),
        ("--annotations", args.annotations is not None),
        ("--report", args.report is not None),
    ):
        if given:
            raise InvalidRequest(f"{flag}: not with {FLAG} (the what-if prints its counts only)")
    shapes = [parse_shape(t, config=config) for t in args.what_if_shape]
    current, where = current_policy(args.current_policy, config)

    def done(o: Outcome, seconds: float) -> None:
        stderr.write(
            f"what-if {o.policy.label}: {o.fit} pod{'' if o.fit == 1 else 's'} fit ({seconds:.1f} s)\n"
        )
        stderr.flush()

    answers = [
        what_if(
            workload.nodes,
            placed,
            s,
            config=config,
            policies=policies,
            current=current,
            nodes_source=workload.nodes_source,
            done=done if args.progress else None,
        )
        for s in shapes
    ]
    kw = {"start": start, "nodes": workload.nodes, "nodes_source": workload.nodes_source}
    if args.json:
        json.dump(answers_json(answers, **kw), stdout, indent=2)
        stdout.write("\n")
    else:
        stdout.write(answers_text(answers, current_from=where, **kw) + "\n")
    return 0


__all__ = (
    "FLAG",
    "MAX_PODS",
    "Outcome",
    "Shape",
    "ShapeAnswer",
    "answers_json",
    "answers_text",
    "current_policy",
    "parse_shape",
    "pod_cap",
    "resource_names",
    "run_what_if",
    "what_if",
)

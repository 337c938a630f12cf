"""Renderers of the tools' reports: aligned tables for people (`hami.tools.table`, which also holds the
colours and when to use them), JSON and YAML for scripts.

The JSON/YAML shape is the documented, stable one (docs/operations.md, "JSON output"): keys are only
ever added, never renamed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from hami.tools.inspect import CardReport, ClusterReport, ContainerOnCard, NodeReport, percent
from hami.tools.table import Style, table

API_VERSION = "hami.io/v1alpha1"
FORMATS = ("table", "wide", "json", "yaml")


def age(seconds: float) -> str:
    """``45s``, ``2m10s``, ``3h05m``, ``2d04h`` (kubectl's style); negative ages (a clock ahead) as ``0s``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def mem_cell(allocated: int, total: int) -> str:
    return f"{allocated}/{total} ({percent(allocated, total):g}%)"


# -- inspect: data --------------------------------------------------------------------------------


def _amounts(used: int, total: int, *, unit: str = "") -> dict[str, Any]:
    if unit == "MiB":
        return {"allocatedMiB": used, "totalMiB": total, "percent": percent(used, total)}
    return {"allocated": used, "total": total}


def container_dict(c: ContainerOnCard) -> dict[str, Any]:
    return {
        "namespace": c.namespace,
        "pod": c.pod,
        "container": c.container,
        "memoryMiB": c.memory,
        "memoryPercent": c.memory_percent,
        "cores": c.cores,
        "usedMiB": c.used,
        "utilization": c.utilization,
        "idle": c.idle,
        "mig": c.mig,
    }


def card_dict(c: CardReport) -> dict[str, Any]:
    return {
        "uuid": c.uuid,
        "index": c.index,
        "vendor": c.vendor,
        "model": c.model,
        "numa": c.numa,
        "health": c.health,
        "cordoned": c.cordoned,
        "slots": {"used": c.slots_used, "total": c.slots},
        "memory": _amounts(c.memory_allocated, c.memory, unit="MiB"),
        "cores": _amounts(c.cores_allocated, c.cores),
        "containers": [container_dict(x) for x in c.containers],
        "mode": c.mode,
        "migFreeProfiles": c.mig_free if c.mode == "mig" else None,
    }


def node_dict(n: NodeReport) -> dict[str, Any]:
    lock = None
    if n.lock is not None:
        lock = {
            "holder": n.lock.holder,
            "since": n.lock.since,
            "ageSeconds": n.lock.age_s,
            "expired": n.lock.expired,
        }
    return {
        "name": n.name,
        "vendors": n.vendors,
        "models": n.models,
        "cardCount": len(n.cards),
        "slots": {"used": n.slots_used, "total": n.slots},
        "memory": _amounts(n.memory_allocated, n.memory, unit="MiB"),
        "cores": _amounts(n.cores_allocated, n.cores),
        "cordoned": n.cordoned,
        "usable": n.problem is None and not n.cordoned,
        "problem": n.problem,
        "handshake": n.handshake,
        "lock": lock,
        "lockProblem": n.lock_problem,
        "cards": [card_dict(c) for c in n.cards],
    }


def inspect_dict(r: ClusterReport) -> dict[str, Any]:
    """The documented JSON/YAML shape of `hami inspect -o json|yaml`."""
    return {
        "apiVersion": API_VERSION,
        "kind": "InspectReport",
        "generated": r.generated,
        "nodes": [node_dict(n) for n in r.nodes],
        "models": [
            {
                "vendor": m.vendor,
                "model": m.model,
                "cards": m.cards,
                "memory": _amounts(m.memory_allocated, m.memory, unit="MiB"),
                "freeCards": m.free,
                "fragmentedCards": m.fragmented,
            }
            for m in r.models
        ],
        "quotas": [
            {"namespace": q.namespace, "resource": q.resource, "used": q.used, "limit": q.limit}
            for q in r.quotas
        ],
        "pendingPods": r.pending,
        "usageJoined": r.usage_joined,
    }


def dump(data: Any, fmt: str) -> str:
    """`data` as JSON (2-space indent, key order kept) or YAML (block style)."""
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


# -- inspect: tables ------------------------------------------------------------------------------


def node_state(n: NodeReport, style: Style) -> str:
    """The STATE cell: ``ok``, or every reason the node takes fewer pods than its cards suggest."""
    parts = []
    if n.cordoned:
        parts.append(style.warn("cordoned"))
    if n.problem:
        parts.append(style.bad(f"unusable: {n.problem}"))
    if n.lock is not None:
        who = n.lock.holder or "an unnamed pod"
        if n.lock.expired:
            parts.append(
                style.warn(f"lock of {who} expired {age(n.lock.age_s)} ago (the next bind takes it over)")
            )
        else:
            parts.append(style.warn(f"locked by {who} for {age(n.lock.age_s)}"))
    if n.lock_problem:
        parts.append(style.bad(n.lock_problem))
    sick = sum(1 for c in n.cards if not c.health)
    if sick:
        parts.append(style.bad(f"{sick} card{'s' if sick > 1 else ''} unhealthy"))
    off = sum(1 for c in n.cards if c.cordoned)
    if off:
        parts.append(style.warn(f"{off} card{'s' if off > 1 else ''} cordoned"))
    return "; ".join(parts) or style.good("ok")


def _card_state(c: CardReport, style: Style) -> str:
    if not c.health:
        state = style.bad("unhealthy")
    else:
        state = style.warn("cordoned") if c.cordoned else style.good("ok")
    if c.mode == "mig":
        # What a new MIG instance could still be: the profiles with a free placement.
        state += f" mig (free: {','.join(c.mig_free) or 'none'})"
    return state


def card_lines(n: NodeReport, style: Style, *, usage: bool) -> list[str]:
    """The per-card table of one node: one row per card, one continuation row per further container."""
    headers = ["IDX", "UUID", "NUMA", "STATE", "SLOTS", "MEMORY MiB", "CORES", "POD", "CONTAINER", "MiB", "%"]
    if usage:
        headers += ["USED MiB", "UTIL %", "IDLE"]
    rows: list[list[str]] = []
    for c in n.cards:
        card = [str(c.index), c.uuid, str(c.numa), _card_state(c, style), f"{c.slots_used}/{c.slots}",
                mem_cell(c.memory_allocated, c.memory), f"{c.cores_allocated}/{c.cores}"]  # fmt: skip
        blank = [""] * len(card)
        if not c.containers:
            rows.append(card + ["-", "", "", ""] + (["", "", ""] if usage else []))
        for i, x in enumerate(c.containers):
            mem = f"{x.memory} ({x.mig.removeprefix('MIG ')})" if x.mig else str(x.memory)
            row = (card if i == 0 else blank) + [f"{x.namespace}/{x.pod}", x.container, mem,
                                                 f"{x.memory_percent:g}"]  # fmt: skip
            if usage:
                idle = x.idle
                row += [
                    "-" if x.used is None else str(x.used),
                    "-" if x.utilization is None else f"{x.utilization:g}",
                    "-" if idle is None else (style.warn("idle") if idle else "no"),
                ]
            rows.append(row)
    return table(headers, rows, style=style, indent="  ")


def render_inspect(r: ClusterReport, fmt: str, *, style: Style, cards: bool = False) -> str:
    """`fmt` table, wide, json or yaml. Cards are listed with `wide` or when `cards` (nodes were named)."""
    if fmt in ("json", "yaml"):
        return dump(inspect_dict(r), fmt)
    out: list[str] = []
    headers = ["NODE", "VENDOR", "MODEL", "CARDS", "SLOTS", "MEMORY MiB", "CORES", "STATE"]
    rows = [
        [n.name, ",".join(n.vendors) or "-", ",".join(n.models) or "-", str(len(n.cards)), f"{n.slots_used}/{n.slots}",
         mem_cell(n.memory_allocated, n.memory), f"{n.cores_allocated}/{n.cores}", node_state(n, style)]
        for n in r.nodes
    ]  # fmt: skip
    out += table(headers, rows, style=style)
    if fmt == "wide" or cards:
        for n in r.nodes:
            if not n.cards:
                continue
            out += ["", style.head(f"{n.name}:") if style.enabled else f"{n.name}:"]
            out += card_lines(n, style, usage=r.usage_joined)
    out.append("")
    mrows = [[m.model, str(m.cards), mem_cell(m.memory_allocated, m.memory), str(m.free), str(m.fragmented)]
             for m in r.models]  # fmt: skip
    out += table(["MODEL", "CARDS", "ALLOCATED MiB", "FREE CARDS", "FRAGMENTED"], mrows, style=style)
    out.append(f"{r.pending} pending device pod{'s' if r.pending != 1 else ''}; fragmented = partly used cards "
               "on which no pending pod's container fits")  # fmt: skip
    if r.quotas:
        out.append("")
        qrows = [[q.namespace, q.resource, str(q.used), str(q.limit)] for q in r.quotas]
        out += table(["NAMESPACE", "QUOTA", "USED", "LIMIT"], qrows, style=style)
    return "\n".join(out) + "\n"


# -- explain --------------------------------------------------------------------------------------


def explain_dict(ex: Any) -> dict[str, Any]:
    """The documented JSON/YAML shape of `hami explain -o json|yaml` (an `hami.tools.explain.Explanation`)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Explanation",
        "pod": ex.pod,
        "status": ex.status,
        "phase": ex.phase,
        "requests": ex.requests,
        "policy": ex.policy,
        "message": ex.message,
        "nodes": ex.nodes,
        "groups": [
            {
                "reason": g.reason,
                "words": g.words,
                "count": len(g.nodes),
                "nodes": g.nodes,
                "detail": g.detail,
            }
            for g in ex.groups
        ],  # fmt: skip
        "suggestions": [
            {
                "kind": s.kind,
                "text": s.text,
                "node": s.node,
                "limits": s.limits,
                "removeAnnotations": s.remove_annotations,
                "endPods": s.end_pods,
            }
            for s in ex.suggestions
        ],  # fmt: skip
        "quota": [{"resource": r, "used": u, "limit": lim} for r, u, lim in ex.quota],
        "node": ex.node,
        "cards": ex.cards,
        "runnersUp": [{"node": r.node, "score": r.score, "fits": r.fits} for r in ex.runners_up],
        "warnings": ex.warnings,
        "priority": ex.priority,
        "preemption": {
            "options": [
                {"node": o.node, "victims": o.victims, "pdbViolations": o.pdb_violations, "chosen": o.chosen}
                for o in ex.preemption
            ],
            "note": ex.preemption_note,
        },
    }


#: Node names shown per reason group before "and N more".
MAX_NAMES = 5


def _names(nodes: Sequence[str]) -> str:
    shown = ", ".join(nodes[:MAX_NAMES])
    return shown + (f" and {len(nodes) - MAX_NAMES} more" if len(nodes) > MAX_NAMES else "")


def render_explain(ex: Any, fmt: str, *, style: Style) -> str:
    """`fmt` table (or wide: every node name), json or yaml."""
    if fmt in ("json", "yaml"):
        return dump(explain_dict(ex), fmt)
    head = {"pending": style.bad("Pending: no node fits"), "fits-now": style.warn("Pending, but a node fits now"),
            "scheduled": style.good("Scheduled"), "rejected": style.bad("Rejected by admission"),
            "no-devices": "Not a device pod", "finished": "Finished",
            "other-scheduler": style.bad("Not for this scheduler"),
            "bypassed": style.bad("Bound without the scheduler")}[ex.status]  # fmt: skip
    out = [f"pod {ex.pod}: {head}"]
    for r in ex.requests:
        out.append(f"  asks   {r}")
    if ex.policy:
        out.append(f"  policy {ex.policy}")
    if ex.message:
        out.append(f"  {ex.message}")
    if ex.groups:
        out.append("")
        out.append(f"{ex.nodes} node{'s' if ex.nodes != 1 else ''}:")
        for g in ex.groups:
            n = len(g.nodes)
            text = g.reason + (f": {g.words}" if g.words else "")
            line = f"  {n} node{'s' if n != 1 else ''}: {style.bad(text) if style.enabled else text}"
            if g.detail:
                line += f" ({g.detail})"
            names = ", ".join(g.nodes) if fmt == "wide" else _names(g.nodes)
            out.append(line)
            out.append(f"      {names}")
    if ex.quota:
        out.append("")
        for res, used, lim in ex.quota:
            out.append(f"quota: namespace {ex.pod.split('/')[0]} uses {used} of limits.{res} {lim}")
    if ex.preemption:
        out.append("")
        out.append(f"preemption (priority {ex.priority}): kube-scheduler would evict on the first node")
        for o in ex.preemption:
            mark = "*" if o.chosen else "-"
            out.append(f"  {mark} {o.node}: {', '.join(o.victims)}")
    elif ex.preemption_note:
        out.append("")
        out.append(f"preemption (priority {ex.priority}): {ex.preemption_note}")
    if ex.suggestions:
        out.append("")
        out.append("what would change it:")
        for s in ex.suggestions:
            out.append(f"  - {style.good(s.text) if style.enabled else s.text}")
    elif ex.status == "pending":
        out.append("")
        out.append("what would change it: nothing found by a smaller request or by ending pods of one node")
    if ex.node and ex.status == "scheduled":
        out.append(f"  node   {ex.node}")
        for c, cards in ex.cards.items():
            out.append(f"  cards  {c}: {', '.join(cards)}")
        if ex.runners_up:
            out.append("")
            rows = [[r.node, f"{r.score:g}", "yes" if r.fits else "no"] for r in ex.runners_up]
            out += table(["OTHER NODE", "SCORE", "FITS NOW"], rows, style=style, indent="  ")
    for w in ex.warnings:
        out.append(f"note: {w}")
    return "\n".join(out) + "\n"

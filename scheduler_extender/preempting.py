"""The extender's /preempt verb (kube-scheduler's `preemptVerb`): kube-scheduler's candidate nodes and
proposed victims in, per node the victims that really free cards for the pod out.

kube-scheduler calls it from DefaultPreemption's PostFilter (`Evaluator.callExtenders` ->
`HTTPExtender.ProcessPreemption`) with the nodes where its own dry run found victims. The decision is
`ClusterState.plan_preemption` (`hami.cluster_preemption`, `hami.preemption`): pure, by the filter's fit.
This route only parses, reads the PodDisruptionBudgets (one LIST: preemption is rare and the budgets'
`disruptionsAllowed` must be current), and answers `NodeNameToMetaVictims`; nodes where no set of
lower-priority pods makes room are left out, which drops them from kube-scheduler's candidates.

The reply has no error field: a request-level problem (bad body, a standby replica, a failure of ours)
is a non-200 answer, which kube-scheduler treats as the extender's error and retries the pod after its
backoff. `PreemptVerbs` is a mixin of `scheduler_extender.service.Extender`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hami.errors import HamiError, InvalidRequest
from hami.preemption import DisruptionBudget, Resident, is_terminating, pod_created, pod_priority
from scheduler_extender import events as ev
from scheduler_extender.verb_state import VerbState
from scheduler_extender.wire import PreemptArgs, parse_preempt_args, preempt_result

log = logging.getLogger("scheduler_extender.service")


class PreemptVerbs(VerbState):
    """/preempt of `scheduler_extender.service.Extender` (a mixin: no state of its own)."""

    async def preempt(self, body: bytes) -> tuple[int, dict[str, Any] | str]:
        """Answer one ExtenderPreemptionArgs body: (HTTP status, ExtenderPreemptionResult or error text)."""
        try:
            args = parse_preempt_args(body)
            not_ready = self.readiness()
            if not_ready is not None:
                self.metrics.preempt_calls.labels("error").inc()
                return 503, f"extender not ready: {not_ready}"
            return 200, await asyncio.to_thread(self._preempt_sync, args)
        except InvalidRequest as e:
            self.metrics.preempt_calls.labels("error").inc()
            return 400, str(e)
        except Exception:  # noqa: BLE001 - never a stack trace to the caller, never a dead server
            log.exception("preempt failed unexpectedly")
            self.metrics.preempt_calls.labels("error").inc()
            return 500, "internal error in the extender; see its log"

    def _budgets(self) -> list[DisruptionBudget] | None:
        """Every PodDisruptionBudget, or None when they cannot be read (logged)."""
        if self.client is None:
            return []
        try:
            return [DisruptionBudget.from_object(p) for p in self.client.list("poddisruptionbudgets")]
        except HamiError as e:
            log.warning(
                "preempt: PodDisruptionBudgets not read (%s); kube-scheduler's counts are reported", e
            )
            return None

    def _preempt_sync(self, args: PreemptArgs) -> dict[str, Any]:
        pod = args.pod
        budgets = self._budgets()
        others: dict[str, Resident] = {}
        for uid, victim in (args.pods or {}).items():
            # Full victims (not cache-capable): pods this state may not count (no device) keep their
            # identity and priority for the reply's order.
            meta = victim.get("metadata") or {}
            others[uid] = Resident(
                uid, str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                pod_priority(victim), pod_created(victim), (), 0, dict(meta.get("labels") or {}),
                is_terminating(victim),
            )  # fmt: skip
        # Cache-capable: UIDs only. A proposed pod this state does not count gets the default priority
        # (0), or one below the preemptor's when that is lower (kube-scheduler proposed only lower ones).
        unknown = min(0, pod_priority(pod) - 1)
        for uids in args.victims.values():
            for uid in uids:
                others.setdefault(uid, Resident(uid, "", "", unknown))
        plans = self.state.plan_preemption(
            pod, args.victims, budgets=budgets or (), others=others, remember=True
        )
        reply: dict[str, tuple[list[str], int]] = {}
        for node, plan in plans.items():
            n = plan.pdb_violations if budgets is not None else args.pdb_violations.get(node, 0)
            reply[node] = ([v.uid for v in plan.victims], n)
        left_out = sorted(set(args.victims) - set(plans))
        self.metrics.preempt_calls.labels("planned" if plans else "no_plan").inc()
        if plans:
            self.events.emit(
                pod, reason=ev.PREEMPTION_PLANNED, message=ev.preemption_message(plans, left_out)
            )
        elif args.victims:
            self.events.emit(
                pod,
                reason=ev.PREEMPTION_NOT_HELPFUL,
                message=f"no set of lower-priority pods frees cards for this pod on {len(left_out)} candidate "
                f"node(s) ({ev.node_names(left_out)})",
                warning=True,
            )
        return preempt_result(reply)

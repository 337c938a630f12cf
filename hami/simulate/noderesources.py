"""kube-scheduler's part of a replayed decision: its view of the nodes' CPU, memory and pod slots.

The simulator does what kube-scheduler does before it calls the extender (the NodeResourcesFit filter on
CPU, memory and pod count, NodeAffinity on `spec.nodeSelector`, NodeUnschedulable for cordoned nodes)
and, for pods without device requests (which never reach the extender), its default LeastAllocated
score. No device rule reads these figures; `hami.simulate.replay` keeps them next to the core's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hami.simulate.workload import SimNode


class NodeResources:
    """kube-scheduler's NodeResourcesFit view: free CPU (millicores), memory (MiB) and pod slots per node.

    Arrays (numpy) because this check runs over every node for every pod.
    """

    def __init__(self, nodes: Sequence[SimNode]) -> None:
        self.names = [n.name for n in nodes]
        self._names = np.array(self.names, dtype=object)
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.cpu_total = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_total = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.cpu = self.cpu_total.copy()
        self.mem = self.mem_total.copy()
        self.slots = np.array([n.max_pods for n in nodes], dtype=np.int64)
        self._totals_positive = bool((self.cpu_total > 0).all() and (self.mem_total > 0).all())
        # `kubectl cordon` (spec.unschedulable): kube-scheduler's NodeUnschedulable filter drops the node
        # before any fit; its pods stay (a snapshot's placed pods may be on it).
        self.open = np.array([not (n.obj.get("spec") or {}).get("unschedulable") for n in nodes], dtype=bool)
        self._labels = [((n.obj.get("metadata") or {}).get("labels") or {}) for n in nodes]
        self._selected: dict[tuple[tuple[str, str], ...], np.ndarray] = {}

    def selected(self, selector: Mapping[str, str] | None) -> np.ndarray | None:
        """kube-scheduler's NodeAffinity filter for a pod's `spec.nodeSelector` (every pair must be a
        label of the node, values compared as strings); None when the pod has no selector."""
        if not selector or not isinstance(selector, Mapping):
            return None
        key = tuple(sorted((str(k), str(v)) for k, v in selector.items()))
        mask = self._selected.get(key)
        if mask is None:
            mask = self._selected[key] = np.array(
                [all(k in labels and str(labels[k]) == v for k, v in key) for labels in self._labels],
                dtype=bool,
            )
        return mask

    def fitting(self, cpu: int, mem: int, selector: Mapping[str, str] | None = None) -> np.ndarray:
        """Boolean mask of the nodes with room for the pod (and matching its `nodeSelector`)."""
        mask = (self.cpu >= cpu) & (self.mem >= mem) & (self.slots > 0) & self.open
        sel = self.selected(selector)
        return mask if sel is None else mask & sel

    def names_of(self, mask: np.ndarray) -> list[str]:
        return self._names[mask].tolist()

    def misfit_text(self, cpu: int, mem: int, selector: Mapping[str, str] | None = None) -> str:
        """kube-scheduler's message: ``0/N nodes are available: 3 Insufficient cpu, 2 Insufficient memory``."""
        sel = self.selected(selector)
        counts = (
            (0 if sel is None else int((~sel).sum()), "node(s) didn't match Pod's node affinity/selector"),
            (int((self.cpu < cpu).sum()), "Insufficient cpu"),
            (int((self.mem < mem).sum()), "Insufficient memory"),
            (int((self.slots <= 0).sum()), "Too many pods"),
            (int((~self.open).sum()), "node(s) were unschedulable"),
        )
        return f"0/{len(self.names)} nodes are available: " + ", ".join(f"{n} {w}" for n, w in counts if n)

    def least_allocated(self, mask: np.ndarray, cpu: int, mem: int) -> int:
        """kube-scheduler's default score for a pod it places alone: most free CPU+memory share after it
        (ties: the first node in input order)."""
        if self._totals_positive:
            # No division by zero, so nothing for nan_to_num to change: the same figures, less work.
            free = (self.cpu - cpu) / self.cpu_total
            free += (self.mem - mem) / self.mem_total
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                free = np.nan_to_num((self.cpu - cpu) / self.cpu_total) + np.nan_to_num(
                    (self.mem - mem) / self.mem_total
                )
        free[~mask] = -np.inf
        return int(np.argmax(free))

    def take(self, i: int, cpu: int, mem: int, sign: int = 1) -> None:
        self.cpu[i] -= sign * cpu
        self.mem[i] -= sign * mem
        self.slots[i] -= sign


__all__ = ("NodeResources",)

"""The `fragmentation` node policy's per-node terms kept as numpy columns, so that one filter scores
every candidate node with a few array operations instead of a Python loop over the active shapes per
node (pure; no I/O, no clock).

Why: the policy's key of a node is ``F_n(M)`` after the pod minus before (`hami.fragmentation`), a sum
over up to 64 learned shapes. Cached per node and pod shape, a filter was cheap only when every node
had seen the pod's exact shape (CPU request included) since its last change; about 2 % of the
filters on the Alibaba trace met a new shape and recomputed that sum in Python for most nodes
(30-60 ms at 1213 nodes). Here a miss costs the same array work as a hit:

- per node (a *slot*): its free capacity (cards, summed in the node's card order as
  `FragmentationModel.node_terms` does), its free CPU (millicores), its value ``F_n(M)`` before the
  pod, and the id of its *state* (its sorted card states, `FragmentationModel.node_states`). A node is
  refreshed when its `_Node.frag` memo was cleared, which `hami.cluster` does on every change of the
  node's usage, cards or CPU: a filter refreshes only the nodes changed since the previous one;
- per state: the containers of each active shape its cards could take (an integer column, the same
  for every node in that state), and per GPU shape (the pod's shape without its CPU) the node's terms
  after `FragmentationModel.gpu_move`. Nodes in one state (idle nodes, full nodes) share them, and a
  state id is reused only after no node is left in it;
- the pod's CPU request enters only in the vectorised value after the move, so a new CPU request is
  no miss at all.

The values are bit for bit those of the scalar path (`FragmentationModel.value_of` of `node_terms` and
`gpu_move`): the same floating-point operations in the same order, the sum over shapes being a
reduction over axis 0, which numpy performs row by row (a property test holds the equality), so the
policy's placements are unchanged.

A table belongs to one active distribution and vendor (`FragmentationModel.tables`, dropped when the
learned workload is refreshed). Not thread-safe: `hami.cluster.ClusterState` calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from operator import attrgetter, methodcaller
from typing import TYPE_CHECKING

import numpy as np

from hami.fragmentation import FragmentationModel, Shape, Terms, card_of_state, card_state, serves, usage_of

if TYPE_CHECKING:
    from hami.node_order import _Node

_FRAG = attrgetter("frag")

#: Bound on the cells (shapes x states) of the per-GPU-shape move columns kept at once (4 bytes each);
#: the least recently used GPU shapes are dropped beyond it and recomputed from the model's memo.
MAX_MOVE_CELLS = 16_000_000
#: Bound on the cells (pod shapes x nodes) of the remembered keys (12 bytes each), likewise.
MAX_KEY_CELLS = 4_000_000


class _Moves:
    """The node terms after one container of a GPU shape, in columns of its own (`col[sid]`, -1 when
    none): only the states it was asked about have one, so a shape that a model rule confines to a
    few nodes holds few. A column holds for the state id's generation it was computed at (`gen`); a
    state id reused for another state finds its column stale and computes into it again."""

    __slots__ = ("col", "gen", "free", "k", "u", "ok", "n")

    def __init__(self, shapes: int, cap: int) -> None:
        self.col = np.full(cap, -1, dtype=np.intp)
        self.gen = np.full(cap, -1, dtype=np.int64)
        self.free = np.zeros(64)
        self.k = np.zeros((shapes, 64), dtype=np.int32)
        self.u = np.zeros((shapes, 64))
        self.ok = np.zeros(64, dtype=bool)
        self.n = 0  # columns in use

    def grow(self, cap: int) -> None:
        n = len(self.col)
        if n < cap:
            self.col = np.concatenate([self.col, np.full(cap - n, -1, dtype=np.intp)])
            self.gen = np.concatenate([self.gen, np.full(cap - n, -1, dtype=np.int64)])

    @property
    def cells(self) -> int:
        return self.k.shape[0] * self.k.shape[1]

    def known(self, sids: np.ndarray, gen: np.ndarray) -> np.ndarray:
        return (self.col[sids] >= 0) & (self.gen[sids] == gen[sids])

    def columns(self, sids: np.ndarray, gen: np.ndarray) -> np.ndarray:
        """Columns for `sids` (distinct), reusing each state id's own; stamped with `gen`."""
        cols = self.col[sids]
        new = np.flatnonzero(cols < 0)
        if new.size:
            need = self.n + new.size
            if need > len(self.free):
                cap = max(need, 2 * len(self.free))
                extra = cap - len(self.free)
                self.free = np.concatenate([self.free, np.zeros(extra)])
                self.k = np.concatenate([self.k, np.zeros((self.k.shape[0], extra), dtype=np.int32)], axis=1)
                self.u = np.concatenate([self.u, np.zeros((self.u.shape[0], extra))], axis=1)
                self.ok = np.concatenate([self.ok, np.zeros(extra, dtype=bool)])
            cols[new] = np.arange(self.n, need)
            self.n = need
            self.col[sids] = cols
        self.gen[sids] = gen[sids]
        return cols


class _Keys:
    """The policy's key per slot for one pod shape (GPU shape and CPU), valid where `at` is the
    slot's stamp (the slot was not refreshed since)."""

    __slots__ = ("x", "at")

    def __init__(self, cap: int) -> None:
        self.x = np.zeros(cap)
        self.at = np.full(cap, -1, dtype=np.int64)

    def grow(self, cap: int) -> None:
        n = len(self.at)
        if n < cap:
            self.x = np.concatenate([self.x, np.zeros(cap - n)])
            self.at = np.concatenate([self.at, np.full(cap - n, -1, dtype=np.int64)])


class NodeTermTable:
    """Per-node and per-state fragmentation terms of one vendor's cards under that vendor's part of
    `model.active` (`FragmentationModel.of`).

    `keys(candidates, shape)` gives, per candidate node, the increase of its ``F_n(M)`` (cards) when
    one container of `shape` goes where `FragmentationModel.gpu_move` puts it and the pod takes
    `shape.cpu` millicores, `inf` where fewer than `shape.nums` cards serve it: the key of the
    `fragmentation` node policy. `values` is ``F_n(M)`` of given terms, vectorised. Nodes that leave
    the cluster keep their slot until the table is dropped (at the next workload refresh).
    """

    def __init__(self, model: FragmentationModel, vendor: str) -> None:
        self.model, self.vendor = model, vendor
        #: The marker a refreshed node carries in its `_Node.frag` memo, mapped to its slot.
        self.token = object()
        self._version = model.version
        #: The vendor's measure under the model's active distribution: its shapes are the rows here.
        self.measure = measure = model.of(vendor)
        s = self._s = len(measure._shapes)
        nums = np.array(measure._nums, dtype=np.float64)
        self._multi = np.flatnonzero(nums > 1)
        self._multi_nums = nums[self._multi].reshape(-1, 1)
        self._nums_col = nums.reshape(s, 1)
        self._p = np.array(measure._p, dtype=np.float64).reshape(s, 1)
        cpu = np.array(measure._cpu, dtype=np.int64)
        self._cpu_rows = np.flatnonzero(cpu > 0)
        self._cpu_m = cpu[self._cpu_rows].astype(np.float64).reshape(-1, 1)
        # per slot
        self._slot: dict[str, int] = {}
        self._slot_states: list[tuple | None] = []
        self._free = np.zeros(0)
        self._cpu = np.zeros(0, dtype=np.int64)
        self._has_cpu = np.zeros(0, dtype=bool)
        self._before = np.zeros(0)
        self._sid = np.zeros(0, dtype=np.intp)
        self._stamp = np.zeros(0, dtype=np.int64)  # bumped on every refresh of the slot
        self._tick = 0
        # per pod shape, least recently used first
        self._keys: OrderedDict[Shape, _Keys] = OrderedDict()
        # per state id
        self._sid_of: dict[tuple, int] = {}
        self._states: list[tuple | None] = []
        self._order: list[tuple] = []  # card states in the card order of the node that made the id
        self._refs: list[int] = []
        self._spare: list[int] = []
        self._k = np.zeros((s, 0), dtype=np.int32)
        self._u = np.zeros((s, 0))
        self._gen = np.zeros(0, dtype=np.int64)  # per state id: bumped when it is released
        self._v0 = np.zeros(0)  # per state id: its value F_n(M) without a CPU limit
        # per card state, its terms; per GPU shape and card state, the terms after one container of
        # that shape (None: the card does not serve it)
        self._card: dict[tuple, Terms] = {}
        self._card_moves: dict[Shape, dict[tuple, Terms | None]] = {}
        # per GPU shape, least recently used first
        self._moves: OrderedDict[Shape, _Moves] = OrderedDict()

    # -- the vectorised measure -----------------------------------------------------------------

    def values(
        self, free: np.ndarray, k: np.ndarray, u: np.ndarray, cpu: np.ndarray, has_cpu: np.ndarray
    ) -> np.ndarray:
        """``F_n(M)`` (cards) per column: `free` capacity (cards, shape (n,)), `k` containers per active
        shape and `u` the capacity they would take (cards; both shape (shapes, n)), free `cpu`
        millicores where `has_cpu` (elsewhere no CPU limit). Equals `FragmentationModel.value_of` of
        each column exactly."""
        if len(free) == 1:
            # A single column would be summed pairwise (see below): give it a twin and drop it.
            twin = self.values(
                np.repeat(free, 2),
                np.repeat(k, 2, axis=1),
                np.repeat(u, 2, axis=1),
                np.repeat(cpu, 2),
                np.repeat(has_cpu, 2),
            )
            return twin[:1]
        # Counts as floats, row-major (gathered columns come out column-major: see the sum below).
        # floor(a / b) of floats is a // b for integers with a + b < 2**53, and float division is
        # several times faster than integer division in numpy.
        kf = np.array(k, dtype=np.float64, order="C")
        c = kf.copy()
        if self._multi.size:
            c[self._multi] = np.floor(c[self._multi] / self._multi_nums)
        if self._cpu_rows.size:
            # kube-scheduler's fit: a node feeds at most floor(cpu_free / cpu_m) pods of shape m, none
            # when it has no free CPU
            cap = np.floor(np.maximum(cpu, 0).astype(np.float64) / self._cpu_m)
            if not has_cpu.all():
                cap[:, ~has_cpu] = np.inf
            c[self._cpu_rows] = np.minimum(c[self._cpu_rows], cap)
        # the pods the node can run take their share of the capacity its cards' room would take
        c *= self._nums_col
        ratio = np.divide(c, kf, out=np.ones_like(c), where=c < kf)
        x = np.array(u, dtype=np.float64, order="C")
        x *= ratio
        np.minimum(x, free, out=x)
        x *= self._p
        # numpy sums pairwise only along the axis that is contiguous in memory (numpy.sum, Notes): the
        # sum over axis 0 of a row-major array of several columns adds the shapes one by one, in the
        # scalar path's order, so the result is the same float.
        out = free - x.sum(axis=0)
        m = self.measure
        if m.cpu_weight:
            starved = free - cpu / m.cpu_per_card  # as the scalar path, column by column
            np.maximum(starved, 0.0, out=starved)
            np.minimum(starved, free, out=starved)  # a node over its CPU strands all it has free
            starved[~has_cpu] = 0.0
            out += m.cpu_weight * starved
        return out

    # -- slots and states -----------------------------------------------------------------------

    def _grow_slots(self) -> None:
        cap = max(64, 2 * len(self._free))
        extra = cap - len(self._free)
        self._free = np.concatenate([self._free, np.zeros(extra)])
        self._cpu = np.concatenate([self._cpu, np.zeros(extra, dtype=np.int64)])
        self._has_cpu = np.concatenate([self._has_cpu, np.zeros(extra, dtype=bool)])
        self._before = np.concatenate([self._before, np.zeros(extra)])
        self._sid = np.concatenate([self._sid, np.full(extra, -1, dtype=np.intp)])
        self._stamp = np.concatenate([self._stamp, np.zeros(extra, dtype=np.int64)])
        self._slot_states.extend([None] * extra)

    def _state_id(self, states: tuple, keys: list[tuple], terms: list[Terms]) -> int:
        """The id of the node state `states` (sorted card states), new or shared; `keys` and `terms`
        are one node's card states and terms in its card order."""
        sid = self._sid_of.get(states)
        if sid is not None:
            self._refs[sid] += 1
            return sid
        if self._spare:
            sid = self._spare.pop()
        else:
            sid = len(self._states)
            self._states.append(None)
            self._order.append(())
            self._refs.append(0)
            if sid >= self._k.shape[1]:
                grow = max(64, self._k.shape[1])
                self._gen = np.concatenate([self._gen, np.zeros(grow, dtype=np.int64)])
                self._v0 = np.concatenate([self._v0, np.zeros(grow)])
                self._k = np.concatenate([self._k, np.zeros((self._s, grow), dtype=np.int32)], axis=1)
                self._u = np.concatenate([self._u, np.zeros((self._s, grow))], axis=1)
        self._sid_of[states] = sid
        self._states[sid] = states
        self._order[sid] = tuple(keys)  # this node's card order, for the move's sum of free compute
        self._refs[sid] = 1
        # containers per shape and the capacity they take, summed over the cards: integers and
        # multiples of 2**-30 cards (`hami.fragmentation.GRAIN`), so the card order does not matter
        if terms:
            self._k[:, sid] = np.sum([t[1] for t in terms], axis=0, dtype=np.int64)
            self._u[:, sid] = np.sum([t[2] for t in terms], axis=0)
        else:
            self._k[:, sid] = 0
            self._u[:, sid] = 0.0
        return sid

    def _terms(self, key: tuple) -> Terms:
        """The terms of a card in state `key` (`card_state`)."""
        t = self._card.get(key)
        if t is None:
            t = self._card[key] = self.measure.card_terms(*card_of_state(key))
        return t

    def _release_state(self, sid: int) -> None:
        self._refs[sid] -= 1
        if self._refs[sid] == 0:
            del self._sid_of[self._states[sid]]
            self._states[sid] = None
            self._spare.append(sid)
            self._gen[sid] += 1  # the moves computed for it no longer hold

    def _refresh(self, nodes: Sequence[_Node]) -> list[int]:
        """Bring the slots of `nodes` (changed since their last refresh) up to date; their slots."""
        vendor, token, version = self.vendor, self.token, self._version
        card = self._card.get
        out: list[int] = []
        free: list[float] = []
        cpus: list[int] = []
        has_cpu: list[bool] = []
        fresh: list[tuple[int, float]] = []
        for n in nodes:
            slot = self._slot.get(n.name)
            if slot is None:
                slot = self._slot[n.name] = len(self._slot)
                if slot >= len(self._free):
                    self._grow_slots()
            look = usage_of(n.usage)
            keys = [card_state(d, look(d.uuid)) for d in n.devices.get(vendor, ())]
            terms = [card(k) or self._terms(k) for k in keys]
            states = tuple(sorted(keys))
            node_free = sum(t[0] for t in terms)  # exact: multiples of 2**-30 cards
            if states != self._slot_states[slot]:
                old = int(self._sid[slot])
                made = len(self._sid_of)
                sid = self._sid[slot] = self._state_id(states, keys, terms)
                if len(self._sid_of) > made:
                    fresh.append((sid, node_free))  # a new state: its value without CPU below
                if old >= 0:
                    self._release_state(old)
                self._slot_states[slot] = states
            free.append(node_free)
            cpu = n.cpu_free()
            has_cpu.append(cpu is not None)
            cpus.append(0 if cpu is None else cpu)
            memo = n.frag
            if memo.get(None) != version:
                memo.clear()
                memo[None] = version
            memo[token] = slot
            out.append(slot)
        if out:
            idx = np.array(out, dtype=np.intp)
            self._free[idx] = free
            self._cpu[idx] = cpus
            self._has_cpu[idx] = has_cpu
            self._stamp[idx] = np.arange(self._tick + 1, self._tick + 1 + len(out))
            self._tick += len(out)
            sids = self._sid[idx]
            # one evaluation: the nodes' values with their CPU, and the new states' without a CPU limit
            # (what every GPU shape's moves compare against, `_fill_moves`); columns are independent
            new = np.array([x for x, _ in fresh], dtype=np.intp)
            got = self.values(
                np.concatenate([self._free[idx], [f for _, f in fresh]]),
                np.concatenate([self._k[:, sids], self._k[:, new]], axis=1),
                np.concatenate([self._u[:, sids], self._u[:, new]], axis=1),
                np.concatenate([self._cpu[idx], np.zeros(len(fresh), dtype=np.int64)]),
                np.concatenate([self._has_cpu[idx], np.zeros(len(fresh), dtype=bool)]),
            )
            self._before[idx] = got[: len(out)]
            self._v0[new] = got[len(out) :]
        return out

    def slots(self, candidates: Sequence[_Node]) -> np.ndarray:
        """The slots of `candidates` (in their order), refreshing those that changed."""
        got = list(map(methodcaller("get", self.token), map(_FRAG, candidates)))  # C-level loops
        if None in got:
            stale = [i for i, s in enumerate(got) if s is None]
            for i, s in zip(stale, self._refresh([candidates[i] for i in stale]), strict=True):
                got[i] = s
        return np.array(got, dtype=np.intp)

    # -- moves ----------------------------------------------------------------------------------

    def _moves_for(self, gpu: Shape) -> _Moves:
        m = self._moves.get(gpu)
        if m is None:
            m = self._moves[gpu] = _Moves(self._s, self._k.shape[1])
            while len(self._moves) > 1 and sum(x.cells for x in self._moves.values()) > MAX_MOVE_CELLS:
                self._moves.popitem(last=False)
        else:
            self._moves.move_to_end(gpu)
            m.grow(self._k.shape[1])
        return m

    def _card_move(self, key: tuple, gpu: Shape) -> Terms | None:
        d, u = card_of_state(key)
        if not serves(d, u, gpu):
            return None
        return self._terms((*key[:5], u.used + 1, u.usedmem + gpu.mem_on(d.devmem), u.usedcores + gpu.cores))

    def _fill_moves(self, m: _Moves, gpu: Shape, sids: np.ndarray) -> None:
        """Compute the moves of the states in `sids` not known yet: what `FragmentationModel.gpu_move`
        computes for a node in that state, with the candidate cards of all those states judged in one
        vectorised evaluation."""
        missing = sids[~m.known(sids, self._gen)]
        if not missing.size:
            return
        missing = np.unique(missing)
        cols = m.columns(missing, self._gen)
        col_of = dict(zip(missing.tolist(), cols.tolist(), strict=True))
        nums = gpu.nums
        moves = self._card_moves.get(gpu)
        if moves is None:
            moves = self._card_moves[gpu] = {}
        if len(self._card) > 200_000 or len(moves) > 200_000:
            self._card.clear()  # bound memory on fleets with very many distinct card states
            moves.clear()
        todo: list[tuple[int, list, list, float]] = []  # (state id, card terms, candidates, free)
        owner: list[int] = []
        r0: list[float] = []
        r1: list[float] = []
        k0: list[tuple[int, ...]] = []
        k1: list[tuple[int, ...]] = []
        u0: list[tuple[float, ...]] = []
        u1: list[tuple[float, ...]] = []
        card, card_terms = self._card.get, self._terms
        for sid in missing.tolist():
            keys = self._order[sid]
            terms = [card(k) or card_terms(k) for k in keys]
            cands = []  # (card index, its terms after one container of the shape)
            seen = set()
            serving = 0
            for ci, key in enumerate(keys):
                after = moves.get(key, False)
                if after is False:
                    after = moves[key] = self._card_move(key, gpu)
                if after is None:
                    continue
                serving += 1
                if nums == 1:  # cards in one state are interchangeable: try one of them
                    if key in seen:
                        continue
                    seen.add(key)
                cands.append((ci, after))
            if serving < nums:
                m.ok[col_of[sid]] = False
                continue
            w = len(todo)
            todo.append((sid, terms, cands, sum(t[0] for t in terms)))  # card order, as node_terms
            for ci, t in cands:
                owner.append(w)
                r0.append(terms[ci][0])
                r1.append(t[0])
                k0.append(terms[ci][1])
                k1.append(t[1])
                u0.append(terms[ci][2])
                u1.append(t[2])
        if not todo:
            return
        # each candidate card's increase of F_n(M) without CPU, as FragmentationModel._deltas
        own = np.array(owner, dtype=np.intp)
        free = np.array([t[3] for t in todo])
        at_sids = np.array([t[0] for t in todo], dtype=np.intp)
        k = self._k[:, at_sids].astype(np.int64)
        uu = self._u[:, at_sids]
        before = self._v0[at_sids]
        change = np.array(k1, dtype=np.int64).T - np.array(k0, dtype=np.int64).T
        # multiples of 2**-30 cards: these sums are exact, as the scalar path's in its order
        uchange = np.array(u1).T - np.array(u0).T
        k2 = k[:, own] + change
        u2 = uu[:, own] + uchange
        no_cpu = np.zeros(len(own), dtype=np.int64)
        after = self.values(free[own] - np.array(r0) + np.array(r1), k2, u2, no_cpu, no_cpu.astype(bool))
        deltas = (after - before[own]).tolist()
        pos = 0
        done, free_after, single, multi, multi_u = [], [], [], [], []
        for w, (sid, terms, cands, _) in enumerate(todo):
            d = deltas[pos : pos + len(cands)]
            best = sorted(range(len(cands)), key=lambda j: (d[j], j))[:nums]  # as the fit orders cards
            for j in best:
                terms[cands[j][0]] = cands[j][1]
            done.append(col_of[sid])
            free_after.append(sum(t[0] for t in terms))  # card order, as gpu_move
            if nums == 1:
                single.append(pos + best[0])
            else:
                picked = [pos + j for j in best]
                multi.append(k[:, w] + change[:, picked].sum(axis=1))
                multi_u.append(uu[:, w] + uchange[:, picked].sum(axis=1))
            pos += len(cands)
        at = np.array(done, dtype=np.intp)
        m.free[at] = free_after
        m.k[:, at] = k2[:, single] if nums == 1 else np.array(multi).T
        m.u[:, at] = u2[:, single] if nums == 1 else np.array(multi_u).T
        m.ok[at] = True

    def _keys_for(self, shape: Shape) -> _Keys:
        kc = self._keys.get(shape)
        cap = len(self._free)
        if kc is None:
            kc = self._keys[shape] = _Keys(cap)
            while len(self._keys) > 1 and len(self._keys) * cap > MAX_KEY_CELLS:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(shape)
            kc.grow(cap)
        return kc

    def keys(self, candidates: Sequence[_Node], shape: Shape) -> np.ndarray:
        """Per candidate, the increase of its ``F_n(M)`` (cards) by one container of `shape` and the
        pod's CPU (`shape.cpu` millicores), `inf` where the shape cannot be served; float64, shape (n,).
        Computed for the candidates refreshed since this shape's last filter, the rest remembered."""
        return self.keys_at(self.slots(candidates), shape)

    def keys_at(self, slots: np.ndarray, shape: Shape) -> np.ndarray:
        """`keys` of the nodes in `slots` (from `slots`, up to date: the caller refreshed every node
        that changed since), without a Python step per node: what a caller that keeps all of a fleet's
        slots (the simulator's mirror of the filter's order) reads for every node at once."""
        if self.model.version != self._version:
            raise RuntimeError("fragmentation table used after the learned workload was refreshed")
        kc = self._keys_for(shape)
        stale = np.flatnonzero(kc.at[slots] != self._stamp[slots])
        if stale.size:
            at = slots[stale]
            sids = self._sid[at]
            gpu = shape._replace(cpu=0)
            m = self._moves_for(gpu)
            self._fill_moves(m, gpu, sids)
            cols = m.col[sids]
            after = self.values(
                m.free[cols], m.k[:, cols], m.u[:, cols], self._cpu[at] - shape.cpu, self._has_cpu[at]
            )
            x = after - self._before[at]
            x[~m.ok[cols]] = np.inf
            kc.x[at] = x
            kc.at[at] = self._stamp[at]
        return kc.x[slots]

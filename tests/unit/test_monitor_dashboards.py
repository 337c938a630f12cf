"""Every PromQL expression in dashboards/ names only metrics and labels that the code registers.

The registered names come from the real exporters, not from a list in this test: the node monitor's
families rendered from a snapshot (with ``--legacy-metrics``) plus its own registry, and the scheduler
extender's `ExtenderMetrics` over a state with one card, one pod and one quota. The PromQL reader
below is deliberately strict: a construct it does not know fails the test instead of being skipped.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.monitor.host import HostGpu
from device_plugin.monitor.metrics import MonitorMetrics, render_snapshot
from device_plugin.monitor.pods import PodRef
from device_plugin.monitor.scanner import ContainerSample, DeviceSample, Snapshot
from hami.cluster import CardStat
from hami.cluster_queries import MigInstanceStat
from hami.model import CardGrant, MigPlacement
from scheduler_extender.metrics import ExtenderMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"

FUNCTIONS = {
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "rate", "irate", "increase", "delta",
    "histogram_quantile", "abs", "clamp_min", "clamp_max", "time", "vector", "label_values",
    "max_over_time", "avg_over_time", "min_over_time",
}  # fmt: skip
CLAUSES = {"by", "without", "on", "ignoring", "group_left", "group_right"}
BINARY = {"and", "or", "unless", "bool"}
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series
TOKEN = re.compile(
    r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<range>\[[0-9a-z_$]+(?::[0-9a-z]*)?\])|(?P<num>\d+(?:\.\d+)?)"""
    r"""|(?P<id>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},]))"""
)


class _FakeState:
    """What `ClusterCollector` reads from a ClusterState: one card, one pod grant, one quota."""

    def card_stats(self):
        return [CardStat("node1", "GPU-a", 0, "NVIDIA-H200", "NVIDIA", 10, 1, 80000, 8000, 100, 20, True)]

    def pod_grants(self):
        return [("team-a", "train-0", "node1", (CardGrant("GPU-a", "NVIDIA", 8000, 20, 1),))]

    def quota_stats(self):
        return [("team-a", "nvidia.com/gpumem", 8000, 64000)]

    def mig_instances(self):
        return [MigInstanceStat("node1", "GPU-a", 0, "MIG-a", "1g.18gb", 9, 0, MigPlacement(6, 1))]

    allocation_mismatches = 0


def _parse(text: str, into: dict[str, set[str]]) -> None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            into.setdefault(s.name, set()).update(s.labels)


@pytest.fixture(scope="module")
def registered() -> dict[str, set[str]]:
    """Sample name -> label names, from the exporters themselves."""
    names: dict[str, set[str]] = {}
    dev = DeviceSample(0, "GPU-a", 1 << 30, 1 << 20, 1, 1, 1, 50.0, 3.0)
    snap = Snapshot(
        taken_at=1.0,
        containers=(ContainerSample(PodRef("team-a", "train-0", "u"), "main", "libvgpu-2", (dev,), 1),),
        host=(HostGpu(0, "GPU-a", "NVIDIA-H200", 1 << 20, 10.0, 5.0),),
    )
    _parse(render_snapshot(snap, node="node1", legacy=True).decode(), names)
    mon = MonitorMetrics()
    mon.observe(snap)
    _parse(generate_latest(mon.registry).decode(), names)
    ext = ExtenderMetrics(_FakeState())
    ext.filter_latency.observe(0.001)
    ext.bind_latency.observe(0.001)
    ext.filter_failed("no_fit")
    ext.bind_failed("lock")
    ext.filters.labels("placed").inc()
    ext.is_leader.set(1)
    ext.synced.set(1)
    _parse(generate_latest(ext.registry).decode(), names)
    return names


def promql_refs(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """(metric -> label names in its matchers, label names in by/on/... clauses) of `expr`.

    Raises AssertionError for anything this reader does not understand.
    """
    pos, toks = 0, []
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            if expr[pos:].strip() == "":
                break
            raise AssertionError(f"cannot read {expr[pos:]!r} in {expr!r}")
        kind = m.lastgroup
        toks.append((kind, m.group(kind)))
        pos = m.end()
    metrics: dict[str, set[str]] = {}
    clause_labels: set[str] = set()
    i = 0
    while i < len(toks):
        kind, val = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "id" and val in CLAUSES:
            if nxt == "(":
                j = i + 2
                while toks[j][1] != ")":
                    k, v = toks[j]
                    if k == "id":
                        clause_labels.add(v)
                    elif v != ",":
                        raise AssertionError(f"unexpected {v!r} in {val}(...) of {expr!r}")
                    j += 1
                i = j + 1
                continue
            i += 1  # group_left without a label list
            continue
        if kind == "id" and val in BINARY:
            i += 1
            continue
        if kind == "id" and (nxt == "(" or val in FUNCTIONS):
            # a call, or an aggregation written `sum by (...) (...)`
            assert val in FUNCTIONS, f"unknown function {val!r} in {expr!r}"
            i += 1
            continue
        if kind == "id":
            labels = metrics.setdefault(val, set())
            i += 1
            if nxt == "{":
                i += 1
                while toks[i][1] != "}":
                    k, lab = toks[i]
                    assert k == "id", f"matcher label expected at {lab!r} in {expr!r}"
                    assert toks[i + 1][1] in ("=", "!=", "=~", "!~"), f"matcher operator in {expr!r}"
                    assert toks[i + 2][0] == "str", f"matcher value in {expr!r}"
                    labels.add(lab)
                    i += 3
                    if toks[i][1] == ",":
                        i += 1
                i += 1
            continue
        i += 1
    return metrics, clause_labels


def _dashboards() -> list[tuple[str, dict]]:
    return [(p.name, json.loads(p.read_text())) for p in sorted(DASHBOARDS.glob("*.json"))]


def _queries(board: dict) -> list[tuple[str, str, str]]:
    """(where, expr, legendFormat) of every panel target and query variable."""
    out = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(board.get("panels", [])):
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r}", t["expr"], t.get("legendFormat", "")))
    for v in board.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']!r}", q, ""))
    return out


def test_there_are_dashboards_with_queries():
    boards = _dashboards()
    assert {name for name, _ in boards} == {"hami-vgpu-cluster.json", "hami-vgpu-containers.json"}
    assert all(len(_queries(b)) >= 10 for _, b in boards)


@pytest.mark.parametrize("name", ["hami-vgpu-cluster.json", "hami-vgpu-containers.json"])
def test_every_expression_uses_registered_metrics_and_labels(registered, name):
    board = json.loads((DASHBOARDS / name).read_text())
    for where, expr, legend in _queries(board):
        lv = re.fullmatch(r"label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)", expr)
        extra_labels = {lv.group(2)} if lv else set()
        metrics, clause = promql_refs(lv.group(1) if lv else expr)
        assert metrics, f"{name} {where}: no metric in {expr!r}"
        union: set[str] = set()
        for metric, labels in metrics.items():
            assert metric in registered, f"{name} {where}: {metric} is not exported by any component"
            have = registered[metric]
            assert labels <= have, f"{name} {where}: {metric} has no label(s) {sorted(labels - have)}"
            union |= have
        for lab in clause | extra_labels | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)):
            assert lab in union, f"{name} {where}: label {lab!r} is on none of {sorted(metrics)}"


def test_every_query_in_the_monitoring_guide_uses_registered_metrics_and_labels(registered):
    text = (REPO / "docs" / "monitoring.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 8
    for block in blocks:
        metrics, clause = promql_refs(block)
        assert metrics, block
        union: set[str] = set()
        for metric, labels in metrics.items():
            assert metric in registered, f"docs/monitoring.md: {metric} is not exported ({block!r})"
            assert labels <= registered[metric], f"docs/monitoring.md: {metric} labels {labels}"
            union |= registered[metric]
        assert clause <= union | SCRAPE_LABELS, f"docs/monitoring.md: labels {sorted(clause - union)} in {block!r}"


def test_every_metric_the_code_registers_is_in_the_monitoring_guide(registered):
    text = (REPO / "docs" / "monitoring.md").read_text()
    families = {re.sub(r"_(bucket|sum|count|created|total)$", "", n) for n in registered}
    missing = sorted(f for f in families if f not in text and f + "_total" not in text)
    assert missing == []


def test_the_reader_catches_unknown_names(registered):
    metrics, clause = promql_refs('sum by (nod) (rate(hami_gpu_memory_used{pod="x"}[5m]))')
    assert metrics == {"hami_gpu_memory_used": {"pod"}} and clause == {"nod"}
    assert "hami_gpu_memory_used" not in registered
    with pytest.raises(AssertionError, match="unknown function"):
        promql_refs("sum_over_time(hami_vgpu_memory_used_bytes[5m])")


def test_committed_json_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("dash_gen", DASHBOARDS / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules["dash_gen"] = gen  # dataclasses look their module up while the file executes
    try:
        spec.loader.exec_module(gen)
    finally:
        del sys.modules["dash_gen"]
    for name, build in gen.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text() == gen.render(build), (
            f"run python dashboards/generate.py ({name})"
        )


def test_extender_allocation_and_quota_families_are_registered(registered):
    assert registered["hami_vgpu_memory_allocated_bytes"] == {"namespace", "node", "pod", "container_index",
                                                              "device_uuid", "zone"}  # fmt: skip
    assert registered["hami_resource_quota_used"] == {"namespace", "quota_name", "limit", "zone"}
    assert registered["hami_resource_quota_limit"] == {"namespace", "quota_name", "zone"}


def _replicated_gauges() -> set[str]:
    """The extender's gauges that every scheduler replica exports from its own cache."""
    reg = ExtenderMetrics(_FakeState()).registry
    return {
        fam.name for fam in reg.collect()
        if fam.type == "gauge" and not fam.name.startswith("hami_scheduler_") and fam.name != "hami_build_info"
    }  # fmt: skip


def _all_queries() -> list[tuple[str, str]]:
    out = [(f"{name} {where}", expr) for name, board in _dashboards() for where, expr, _ in _queries(board)]
    text = (REPO / "docs" / "monitoring.md").read_text()
    out += [("docs/monitoring.md", b) for b in re.findall(r"```promql\n(.*?)```", text, flags=re.S)]
    return out


def test_replicated_extender_gauges_are_combined_with_max_never_summed():
    # With scheduler.replicas > 1 each replica is scraped and reports the same allocation: a sum (or a
    # bare series) would count a card or a pod once per replica.
    gauges = _replicated_gauges()
    assert {"hami_gpu_memory_allocated_bytes", "hami_vgpu_memory_allocated_bytes", "hami_resource_quota_used"} <= gauges
    seen = 0
    for where, expr in _all_queries():
        if expr.startswith("label_values("):
            continue
        for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
            if m.group() not in gauges:
                continue
            seen += 1
            before = expr[: m.start()].rstrip()
            assert re.search(r"max(\s+by\s*\([^()]*\))?\s*\($", before), f"{where}: {m.group()} not under max in {expr!r}"
    assert seen >= 10

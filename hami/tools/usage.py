"""`hami inspect --usage`: the node monitors' figures next to what the scheduler allocated.

The node monitor (`hami-vgpu-monitor`, one per GPU node, port 9394) serves, per container and card,
``hami_vgpu_memory_used_bytes`` and ``hami_container_device_utilization_ratio`` (percent 0-100) with the
labels ``namespace``, ``pod``, ``container``, ``device_uuid``. They are read either from every node's
monitor (`--monitor-url`, a template with ``{node}`` and ``{ip}``, the node's InternalIP) or from
Prometheus (`--prometheus URL`, one instant query per family). A monitor that does not answer leaves
its containers without figures and is reported once; it never fails the command.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hami import objects
from hami.tools.inspect import ClusterReport

USED = "hami_vgpu_memory_used_bytes"
UTIL = "hami_container_device_utilization_ratio"
DEFAULT_MONITOR_URL = "http://{ip}:9394/metrics"
MIB = 1024 * 1024

#: (namespace, pod, container, device_uuid) -> {"used": bytes, "util": percent}
Figures = dict[tuple[str, str, str, str], dict[str, float]]


def _key(labels: Mapping[str, str]) -> tuple[str, str, str, str]:
    return (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""),
            labels.get("device_uuid", ""))  # fmt: skip


def parse_metrics(text: str) -> Figures:
    """The used-memory and utilisation samples of a monitor's exposition text."""
    out: Figures = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == USED:
                out.setdefault(_key(s.labels), {})["used"] = float(s.value)
            elif s.name == UTIL:
                out.setdefault(_key(s.labels), {})["util"] = float(s.value)
    return out


def _get(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - an operator-given URL
        return resp.read().decode("utf-8", "replace")


def node_ip(node: Mapping[str, Any]) -> str:
    for a in objects.status(node).get("addresses") or []:
        if isinstance(a, dict) and a.get("type") == "InternalIP":
            return str(a.get("address", ""))
    return objects.name(node)


def scrape_monitors(
    nodes: Iterable[Mapping[str, Any]], template: str, *, timeout_s: float = 5.0
) -> tuple[Figures, list[str]]:
    """Scrape every node's monitor; returns the figures and one warning per monitor that failed."""
    out: Figures = {}
    warnings = []
    for node in nodes:
        name = objects.name(node)
        url = template.format(node=name, ip=node_ip(node))
        try:
            out.update(parse_metrics(_get(url, timeout_s)))
        except (OSError, ValueError, urllib.error.URLError) as e:
            warnings.append(f"monitor of node {name} at {url}: {' '.join(str(e).split())}")
    return out, warnings


def query_prometheus(base: str, *, timeout_s: float = 10.0) -> Figures:
    """Both families through Prometheus' instant query API (``/api/v1/query``).

    Raises OSError (unreachable) or ValueError (an answer that is not a Prometheus success).
    """
    out: Figures = {}
    for name, field in ((USED, "used"), (UTIL, "util")):
        url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": name})
        body = json.loads(_get(url, timeout_s))
        if body.get("status") != "success":
            raise ValueError(f"prometheus {base}: query {name}: {body.get('error') or body.get('status')}")
        for r in body.get("data", {}).get("result", []):
            out.setdefault(_key(r.get("metric", {})), {})[field] = float(r["value"][1])
    return out


def join(report: ClusterReport, figures: Figures) -> None:
    """Put the figures on the report's containers (used MiB, utilisation percent)."""
    report.usage_joined = True
    for n in report.nodes:
        for c in n.cards:
            for x in c.containers:
                f = figures.get((x.namespace, x.pod, x.container, c.uuid))
                if f is None:
                    continue
                if "used" in f:
                    x.used = int(f["used"] // MIB)
                if "util" in f:
                    x.utilization = round(f["util"], 1)

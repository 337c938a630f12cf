"""Render helm/hami with the real Helm engine (helm-python-sdk: Helm v4's Go code as a shared library).

Why a helper of our own: the SDK's `Chart.render` takes values, release name and namespace but no
cluster capabilities, and the chart's output depends on them (the kube-scheduler image tag and the
`KubeSchedulerConfiguration` apiVersion follow `.Capabilities.KubeVersion`; the ServiceMonitor needs
`monitoring.coreos.com/v1` in `.Capabilities.APIVersions`). The native `helm_render` call under it
accepts both as options (`kube_version`, `api_versions`), so this one function calls it directly; if a
later SDK exposes them, only this function changes.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "hami"
RELEASE = "hami"
NAMESPACE = "hami-system"

# Kubernetes versions the chart supports and is validated against.
KUBE_VERSIONS = ("v1.23.0", "v1.25.0", "v1.28.0", "v1.30.0", "v1.33.0")


@dataclass
class Rendered:
    """One render: every object (hooks included) in file order, and NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str = ""
    files: dict[str, str] = field(default_factory=dict)

    def find(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        """Objects of `kind` (and `name`)."""
        return [
            o for o in self.objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        """The single object of `kind`/`name`; AssertionError when absent or repeated."""
        found = self.find(kind, name)
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered; have {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        return [f"{o['kind']}/{o['metadata']['name']}" for o in self.objects]


def render(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str = "v1.30.0",
    api_versions: list[str] | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> Rendered:
    """Render the chart as `helm template` would for a cluster of `kube_version` serving `api_versions`.

    Raises helm_python.HelmValuesError (values.schema.json rejected the values; the message names the
    key) or helm_python.HelmRenderError (a template failed, e.g. a `fail` in the chart).
    """
    from helm_python import _native

    chart = _chart()
    opts = {
        "name": release,
        "namespace": namespace,
        "kube_version": kube_version,
        "api_versions": list(api_versions or []),
        "is_install": True,
    }
    out = json.loads(
        _native.call_string("helm_render", chart._raw(), json.dumps(values or {}), json.dumps(opts))  # noqa: SLF001
    )
    objects: list[dict[str, Any]] = []
    notes = ""
    for path in sorted(out, key=_template_order):
        if path.endswith("NOTES.txt"):
            notes = out[path]
            continue
        for doc in yaml.safe_load_all(out[path]):
            if doc:
                objects.append(doc)
    return Rendered(objects=objects, notes=notes, files=out)


@functools.cache
def _chart():
    """The chart loaded once per process (a native handle; rendering does not change it)."""
    import helm_python

    return helm_python.Chart.load(CHART)


def _template_order(path: str) -> tuple[int, str]:
    # Helpers first is irrelevant (they render nothing); keep a stable, readable order.
    return (0 if "templates/" in path else 1, path)

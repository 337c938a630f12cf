"""Renders shared by the chart tests: each (value set, Kubernetes version) is rendered once per session."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.chart.render import KUBE_VERSIONS, Rendered, render
from tests.ci import require_module

require_module("helm_python", "helm-python-sdk (test extras) renders the chart")

SERVICE_MONITOR_API = "monitoring.coreos.com/v1"

# Realistic value sets an operator would install with (besides the defaults).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ha": {"scheduler": {"replicas": 2}},
    "cert-manager": {"scheduler": {"certManager": {"enabled": True}}},
    "servicemonitor": {"prometheus": {"enabled": True, "labels": {"release": "prometheus"}}},
    # Ascend is off by default (HAMi's --enable-ascend): its chips' resources must join managedResources.
    "second-vendor": {"devices": {"ascend": {"enabled": True}}},
    "private-registry": {
        "global": {"imageRegistry": "registry.example.com", "imagePullSecrets": [{"name": "regcred"}]},
    },
}


@functools.cache
def rendered(value_set: str, kube_version: str = "v1.30.0") -> Rendered:
    """The chart rendered with VALUE_SETS[value_set] for `kube_version` (ServiceMonitor API served)."""
    return render(VALUE_SETS[value_set], kube_version=kube_version, api_versions=[SERVICE_MONITOR_API])


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module", params=KUBE_VERSIONS)
def kube_version(request: pytest.FixtureRequest) -> str:
    return request.param

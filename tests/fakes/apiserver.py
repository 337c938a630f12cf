"""Pytest fixtures around the in-memory API server (`hami.testing.apiserver`) and object builders.

Use from any test module with ``pytest_plugins = ["tests.fakes.apiserver"]`` in a conftest, or
import the fixtures by name. Each test gets a fresh server on 127.0.0.1 (any free port):

* ``fake_apiserver``: the running `FakeApiServer` (``.url``, ``.kubeconfig_path``, ``.store`` to seed
  and assert, ``.faults`` to inject errors, ``.drop_watches()``, ``.compact()``);
* ``kubeconfig``: path of a kubeconfig pointing at it;
* ``kube_client``: a `hami.kube.KubeClient` on it with fast retry backoff (tests stay quick).

Builders return plain dicts in the API's JSON form: `make_node`, `make_pod`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from hami.kube import KubeClient
from hami.testing.apiserver import FakeApiServer


@pytest.fixture
def fake_apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval_s=0.2).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kubeconfig(fake_apiserver: FakeApiServer) -> str:
    assert fake_apiserver.kubeconfig_path is not None
    return fake_apiserver.kubeconfig_path


@pytest.fixture
def kube_client(kubeconfig: str) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(
        kubeconfig, timeout_s=5.0, retries=4, retry_initial_wait_s=0.01, retry_max_wait_s=0.05
    )
    try:
        yield client
    finally:
        client.close()


def make_node(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node as kubelet registers it (Ready, with capacity = allocatable)."""
    resources = dict(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"})
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    node_name: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    scheduler_name: str = "hami-scheduler",
    limits: Sequence[Mapping[str, str]] = ({"nvidia.com/gpu": "1"},),
    phase: str = "Pending",
) -> dict[str, Any]:
    """A Pod with one container per entry of `limits` (container names c0, c1, ...)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [
            {"name": f"c{i}", "image": "busybox", "resources": {"limits": dict(lim)}}
            for i, lim in enumerate(limits)
        ],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }

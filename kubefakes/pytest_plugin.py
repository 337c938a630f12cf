"""Pytest fixtures around the in-memory API server (`kubefakes.apiserver`).

Registered once for the whole suite by ``pytest_plugins = ["kubefakes.pytest_plugin"]`` in
``tests/conftest.py``; any other project can do the same. Each test gets a fresh server on 127.0.0.1
(any free port):

* ``fake_apiserver``: the running `FakeApiServer` (``.url``, ``.kubeconfig_path``, ``.store`` to seed
  and assert, ``.faults`` to inject errors, ``.drop_watches()``, ``.compact()``), with watch bookmarks
  every 0.2 s;
* ``kubeconfig``: path (str) of a kubeconfig pointing at it;
* ``kube_client``: a `hami.kube.KubeClient` on it with a 5 s timeout and fast retry backoff
  (4 retries, 0.01-0.05 s), so tests stay quick.

A test module may define a fixture of the same name to start the server differently.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hami.kube import KubeClient
from kubefakes.apiserver import FakeApiServer


@pytest.fixture
def fake_apiserver() -> Iterator[FakeApiServer]:
    """A fresh in-memory API server, stopped after the test."""
    server = FakeApiServer(bookmark_interval_s=0.2).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kubeconfig(fake_apiserver: FakeApiServer) -> str:
    """Path of the kubeconfig `fake_apiserver` wrote."""
    assert fake_apiserver.kubeconfig_path is not None
    return fake_apiserver.kubeconfig_path


@pytest.fixture
def kube_client(kubeconfig: str) -> Iterator[KubeClient]:
    """A `KubeClient` on `fake_apiserver` with fast retries; closed after the test."""
    client = KubeClient.from_kubeconfig(
        kubeconfig, timeout_s=5.0, retries=4, retry_initial_wait_s=0.01, retry_max_wait_s=0.05
    )
    try:
        yield client
    finally:
        client.close()

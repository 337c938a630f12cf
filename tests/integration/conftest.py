"""Fixtures shared by the integration tests (a module's own fixtures of the same name take precedence).

The API server fixtures (`fake_apiserver`, `kubeconfig`, `kube_client`) are registered suite-wide by
``tests/conftest.py`` from `kubefakes.pytest_plugin`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session per test."""
    async with aiohttp.ClientSession() as s:
        yield s

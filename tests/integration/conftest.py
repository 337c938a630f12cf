"""Fixtures shared by the integration tests (a module's own fixtures of the same name take precedence)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from hami.testing.apiserver import FakeApiServer
from tests.integration.extender_harness import api_server


@pytest.fixture
def fake_apiserver() -> Iterator[FakeApiServer]:
    """A fresh in-memory API server (see `extender_harness.api_server`)."""
    yield from api_server()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session per test."""
    async with aiohttp.ClientSession() as s:
        yield s

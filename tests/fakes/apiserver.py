"""Moved: fixtures to `kubefakes.pytest_plugin` (registered by tests/conftest.py), builders to
`tests.builders`; these names stay importable until every importer is updated."""

from tests.builders import make_node, make_pod  # noqa: F401

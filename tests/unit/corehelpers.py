"""Moved to `tests.builders`; these names stay importable until every importer is updated."""

from tests.builders import V100, cards, ctr, node, pod  # noqa: F401

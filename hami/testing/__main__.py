"""Deprecated: ``python -m kubefakes.apiserver`` (same flags)."""

from kubefakes.apiserver import main

raise SystemExit(main())

"""Deprecated: ``python -m kubefakes.apiserver`` (same flags)."""

import sys

from kubefakes.apiserver import main

print("python -m hami.testing is deprecated; use python -m kubefakes.apiserver", file=sys.stderr)
raise SystemExit(main())

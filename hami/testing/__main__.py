"""``python -m hami.testing``: the in-memory API server (same flags as ``python -m hami.testing.apiserver``)."""

from hami.testing.apiserver import main

raise SystemExit(main())

"""Deprecated alias of `kubefakes` (the test kits moved out of the product); removed in the next release.

``hami.testing.apiserver`` re-exports `kubefakes.apiserver` and ``python -m hami.testing.apiserver``
still starts the in-memory API server; both warn. Use ``kubefakes.apiserver`` instead.
"""

import warnings

warnings.warn(
    "hami.testing is deprecated and will be removed in the next release; use kubefakes.apiserver",
    DeprecationWarning,
    stacklevel=2,
)

"""The operator's tools: `hami inspect` (what is on each card) and `hami explain` (why is this pod Pending).

Layers, downwards only: `command` (flags, exit codes, the one read through `hami.kube`) -> `snapshot`
(the listed objects built into the same `ClusterState` the extender uses) -> `inspect` / `explain`
(pure functions from a snapshot to report objects, using the real fit and filter) -> `render` (table,
wide, json, yaml; its tables through `table`, the printer `hami simulate` shares). `usage` joins the node monitors' figures; `kubectl` is the ``kubectl-hami`` plugin.
"""

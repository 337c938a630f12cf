"""HAMi's scheduler extender: kube-scheduler calls /filter and /bind; we pick the node and the exact cards.

Layers: `wire` (ExtenderArgs/ExtenderFilterResult/ExtenderBindingArgs codecs), `service` (filter and bind
orchestration over `hami.cluster.ClusterState`, `hami.kube` and `hami.nodelock`), `sync` (reflectors
feeding the state for one leadership term), `runtime` (leader election and readiness), `events`,
`metrics`, `app` (aiohttp routes) and `cli` (flags and the server loop).
"""

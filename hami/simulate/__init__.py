"""`hami simulate`: a what-if simulator that replays a GPU cluster trace through the scheduler's own core.

Modules, in the order data flows:
- `workload`  the input model (Node / Pod JSON plus CPU, memory, GPU demand and trace times), the openb
              request mapping and the GPU model table;
- `openb`, `kubeyaml`, `generate`  loaders: openb CSV, Kubernetes YAML, the built-in seeded generator;
- `engine`    the replay (kube-scheduler CPU/memory fit, then `hami.cluster.ClusterState.filter`);
- `report`, `plots`  summary table, JSON, placements CSV, PNG figures;
- `command`   the `hami simulate` command line.
"""

"""The node monitor (``hami-vgpu-monitor``): per-container GPU usage in Prometheus, with HAMi's names.

Why it exists: an operator who shares one card between many containers must see who uses what. The
numbers are already on the node: every container's libvgpu (or, during a migration, HAMi-core's
``libvgpu.so``) keeps its accounting in a shared file inside the container's cache directory on the
host. This package reads those files without taking any lock and without ever writing to them, maps
each directory to its pod through one watch of this node's pods, and serves HAMi's vGPU monitor metric
families so existing dashboards and alerts keep working.

Modules, bottom up: `regions` (binary readers of the three file layouts), `procs` (is a slot's process
alive), `pods` (pod UID -> namespace/name from the watch), `host` (whole-card figures from NVML or a
fake file), `scanner` (one pass over the cache directories -> a snapshot), `metrics` (the families),
`routes` / `app` / `cli` (the HTTP server and the command).
"""

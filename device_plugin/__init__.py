"""HAMi legacy-mode device plugin: kubelet device plugin API v1beta1 over pluggable card backends.

Modules: api/ (proto + stubs), devices (cards -> virtual devices), backends/ (nvidia, fake), server
(generic gRPC service), registration (socket + kubelet Register + re-registration), allocator (Allocate
from the scheduler's annotations), node_register (hami.io/node-nvidia-register), metrics, app (wiring),
cli (``hami-device-plugin``).
"""

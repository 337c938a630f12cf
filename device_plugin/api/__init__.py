"""Kubelet device plugin API v1beta1: our own ``api.proto`` and the stubs generated from it.

Import the messages as ``from device_plugin.api import api_pb2 as pb`` and the services from
``api_pb2_grpc``. This package deliberately imports neither, so that ``python -m
device_plugin.api.generate`` still runs when the stubs are missing or stale.
"""

VERSION = "v1beta1"  # the only version kubelets accept (SupportedVersions)
HEALTHY = "Healthy"  # health strings are case-sensitive; anything else counts as unhealthy
UNHEALTHY = "Unhealthy"
KUBELET_SOCKET_NAME = "kubelet.sock"
DEFAULT_SOCKET_DIR = "/var/lib/kubelet/device-plugins/"

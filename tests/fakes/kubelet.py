"""Moved to `kubefakes.kubelet`; this name stays importable until every importer is updated."""

from kubefakes.kubelet import *  # noqa: F403
from kubefakes.kubelet import AdmissionError, FakeKubelet, env_of, mounts_of  # noqa: F401

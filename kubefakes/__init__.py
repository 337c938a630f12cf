"""Test kits that stand in for Kubernetes where no cluster runs: not part of the product.

* `kubefakes.apiserver`: an in-memory API server the official `kubernetes` client talks to over HTTP
  (``python -m kubefakes.apiserver`` runs it as a process);
* `kubefakes.kubelet`: a fake kubelet device manager (Registration, ListAndWatch, admission);
* `kubefakes.pytest_plugin`: the pytest fixtures around them.

Nothing in `hami`, the servers or the CLI imports this package; it may import them.
"""

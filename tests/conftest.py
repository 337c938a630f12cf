"""Suite-wide pytest setup: the in-memory API server fixtures (`fake_apiserver`, `kubeconfig`,
`kube_client`) come from `kubefakes.pytest_plugin`, registered here once for every test directory."""

pytest_plugins = ["kubefakes.pytest_plugin"]

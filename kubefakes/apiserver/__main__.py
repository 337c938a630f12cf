"""``python -m kubefakes.apiserver --port 0 --kubeconfig-out F``: the in-memory API server as a process."""

from kubefakes.apiserver.server import main

raise SystemExit(main())

"""Deprecated: use `kubefakes.apiserver` (same names, same command line)."""

from kubefakes.apiserver import (
    RESOURCES,
    ApiStatusError,
    FakeApiServer,
    Fault,
    FaultInjector,
    ResourceInfo,
    Store,
    main,
    status_body,
    write_kubeconfig,
)

__all__ = [
    "ApiStatusError",
    "Fault",
    "FaultInjector",
    "FakeApiServer",
    "RESOURCES",
    "ResourceInfo",
    "Store",
    "status_body",
    "write_kubeconfig",
    "main",
]

if __name__ == "__main__":
    import sys

    print(
        "python -m hami.testing.apiserver is deprecated; use python -m kubefakes.apiserver", file=sys.stderr
    )
    raise SystemExit(main())

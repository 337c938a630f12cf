"""An in-memory Kubernetes API server that the official `kubernetes` Python client talks to over HTTP.

Why it exists: no real kube-apiserver can run where this project is tested, yet the extender, the
device plugin and the webhook must be tested against the real client library and the real wire
behaviour (list + watch with resourceVersion, bookmarks, ``410 Gone``, optimistic concurrency, the
three patch formats, the Binding subresource). This server reproduces that behaviour for the
resources the project uses:

* core/v1: ``nodes`` (+``/status``), ``pods`` (+``/status``, ``/binding``), ``bindings``, ``events``,
  ``resourcequotas`` (+``/status``), ``namespaces`` (+``/status``);
* coordination.k8s.io/v1: ``leases``;
* admissionregistration.k8s.io/v1: ``mutatingwebhookconfigurations``, ``validatingadmissionpolicies``
  and ``validatingadmissionpolicybindings``, which the server enforces (`kubefakes.apiserver.admission`:
  bearer tokens name the user, the mutating webhooks are called on CREATE and UPDATE, the policies'
  CEL is evaluated).
* policy/v1: ``poddisruptionbudgets`` (stored as given: no disruption controller fills the status).

Faithful points (each is what kube-apiserver does): one global, increasing resourceVersion; list
answers carry ``metadata.resourceVersion`` and items without ``kind``/``apiVersion``; PUT or a patch
carrying a stale ``metadata.resourceVersion`` is ``409 Conflict``; a write that changes nothing is a
no-op (no new resourceVersion, no event); the main resource ignores ``status``, and ``/status``
changes the status, labels and annotations but never the spec (nor a pod's ownerReferences and
deletionTimestamp: podStatusStrategy); pod create drops the request's
status (phase ``Pending``) and defaults ``schedulerName``; watch from a resourceVersion older than the
bounded event history answers an ``ERROR`` event with a ``410 Expired`` Status; watches with
selectors see ``DELETED``/``ADDED`` when an object leaves/enters the selection; every error body is a
``Status`` shaped like the real server's (message, reason, details, code).

Not implemented (not used by the project): protobuf/CBOR, server-side apply, authorization (every
authenticated user may do everything), validating webhooks, admission on DELETE and CONNECT,
``matchConditions`` of webhooks, garbage collection, managedFields, pagination consistency across pages.

Cost model: get/create/update/patch/delete are O(1) in the number of stored objects plus the object
size; a watch event costs O(watchers of that resource); a list scans one namespace (or the whole
resource), except ``spec.nodeName=<node>`` pod lists, which use an index. The event history is
bounded per resource.

Use in tests: `FakeApiServer` (background thread, ``.url``, ``.kubeconfig_path``, ``.store`` for
seeding and assertions, ``.faults`` for injected errors, ``.drop_watches()``, ``.compact()``); the
pytest fixtures are in `kubefakes.pytest_plugin`. As a separate process (e.g. for benchmarks, so
the server does not share the GIL with the code under test):
``python -m kubefakes.apiserver --port 0 --kubeconfig-out /tmp/kubeconfig [--seed objects.json]``
prints its URL; the same hooks are then reachable over HTTP under ``/_fake/`` (see
`ApiRoutes._control`).

Modules, one concern each: `server` (thread, lifecycle, command line), `routes` (HTTP paths and
verbs), `admission` (users, webhooks, policies), `faults`, `resources` (the served resources), `status` (Status errors), `validation`,
`store` (resourceVersions, reads, watch registration), `table` (one resource's objects, event history
and watcher queues), `writes` (the write verbs), `watchers` (the watch stream),
`patches` (the three patch formats), `selectors` (label and field selectors).
"""

from kubefakes.apiserver.faults import Fault, FaultInjector
from kubefakes.apiserver.resources import RESOURCES, ResourceInfo
from kubefakes.apiserver.server import FakeApiServer, main, write_kubeconfig
from kubefakes.apiserver.status import ApiStatusError, status_body
from kubefakes.apiserver.store import Store

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

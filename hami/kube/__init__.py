"""The project's only door to the Kubernetes API server (the official `kubernetes` client).

Cut as client-go cuts it, one file per thing held:

* `client`: `KubeClient`, plain-dict calls (get, list, create, patch, replace, delete, watch,
  Binding, events, leases), the hot ones also as coroutines;
* `transport`: `ApiTransport`, how those requests are sent (urllib3 pool, rate limit, auth, retries)
  and the construction from a kubeconfig; `aio`: `AsyncTransport`, the same from the event loop;
* `retry`: the one retry policy (`Backoff`, `retry_call`, `retry_call_async`) and the mapping of
  API answers to `hami.errors`;
* `events`: core/v1 Events with repeat counting;
* `watch`: `WatchStream`, one open watch;
* `reflector`: `Reflector`, list + watch into a cache with relist on ``410 Gone``;
* `leader`: `LeaderElector`, one active replica through a Lease;
* `resources`: the resource table and the API's time formats.

Only this package imports `kubernetes`, `urllib3` and `tenacity` (an import-linter contract checks
it). Everything is re-exported here, so ``from hami.kube import KubeClient`` is the usual import.
"""

from hami.errors import ApiError, ResourceExpired
from hami.kube.client import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, KubeClient
from hami.kube.events import EVENT_MESSAGE_MAX, EventLog
from hami.kube.leader import LeaderElector
from hami.kube.reflector import Reflector
from hami.kube.resources import RESOURCES, now_micro, now_rfc3339, object_key
from hami.kube.retry import Backoff, retry_call, retry_call_async
from hami.kube.transport import AUTH_REFRESH_S
from hami.kube.watch import WatchStream

__all__ = [
    "AUTH_REFRESH_S",
    "EVENT_MESSAGE_MAX",
    "JSON_PATCH",
    "MERGE_PATCH",
    "RESOURCES",
    "STRATEGIC_MERGE_PATCH",
    "ApiError",
    "Backoff",
    "EventLog",
    "KubeClient",
    "LeaderElector",
    "Reflector",
    "ResourceExpired",
    "WatchStream",
    "now_micro",
    "now_rfc3339",
    "object_key",
    "retry_call",
    "retry_call_async",
]

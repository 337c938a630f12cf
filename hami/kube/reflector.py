"""`Reflector`: list, then watch, one resource in a background thread (client-go's tools/cache).

Why its own thread and cache: the servers answer from memory (the extender's filter makes no API
call), so something has to keep that memory equal to the API server's: relist on ``410 Gone``,
reconnect with backoff after errors, resume from the last resourceVersion (bookmarks included).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hami.errors import ResourceExpired
from hami.kube.resources import meta_of, object_key
from hami.kube.resources import resource as resource_of
from hami.kube.retry import Backoff
from hami.kube.watch import WatchStream

if TYPE_CHECKING:
    from hami.kube.client import KubeClient

log = logging.getLogger(__name__)


class Reflector:
    """List, then watch, one resource in a background thread, and call back on every change.

    Callbacks run on the reflector's thread, in order, and must be quick (a lock and a dict update);
    an exception in one is logged and does not stop the reflector.

    * ``on_sync(items)`` after every (re)list with the complete current list: the receiver replaces
      its state (anything absent is gone). Without `on_sync`, a relist is delivered as the
      differences instead: ``on_add`` for new, ``on_update`` for changed, ``on_delete`` for vanished.
    * ``on_add(obj)``, ``on_update(old, new)``, ``on_delete(obj)`` for watch events (`old` is the last
      state this reflector saw).

    Relists on ``410 Gone``; reconnects after errors or a dropped connection with exponential
    backoff (`backoff_initial_s` .. `backoff_max_s`) from the last resourceVersion seen (including
    bookmarks), so a reconnect does not replay history. `items()`/`get()` read the reflector's cache.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: str,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        on_add: Callable[[dict[str, Any]], None] | None = None,
        on_update: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
        on_delete: Callable[[dict[str, Any]], None] | None = None,
        on_sync: Callable[[list[dict[str, Any]]], None] | None = None,
        watch_timeout_s: float = 300.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        name: str | None = None,
    ) -> None:
        resource_of(resource)
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.on_add = on_add
        self.on_update = on_update
        self.on_delete = on_delete
        self.on_sync = on_sync
        self.watch_timeout_s = watch_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.name = name or f"reflector-{resource}"
        self.resource_version = ""
        self.list_count = 0
        self.watch_count = 0
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}
        self._cache_lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._force_relist = False

    # -- control -----------------------------------------------------------------------------------

    def start(self) -> Reflector:
        """Start the background thread (once); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop and join the thread; an open watch is closed at once."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def resync(self) -> None:
        """Relist now (e.g. at the start of a leadership term): `synced` is False until it is delivered."""
        self._synced.clear()
        self._force_relist = True
        stream = self._stream
        if stream is not None:
            stream.close()

    @property
    def synced(self) -> bool:
        """True once the first list has been delivered."""
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        """Block until the first list has been delivered; False on timeout."""
        return self._synced.wait(timeout_s)

    def items(self) -> list[dict[str, Any]]:
        """The objects currently known (shared dicts; do not modify)."""
        with self._cache_lock:
            return list(self._cache.values())

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """One cached object, or None."""
        with self._cache_lock:
            return self._cache.get((namespace or "", name))

    # -- loop --------------------------------------------------------------------------------------

    def _call(self, fn: Callable[..., None] | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a receiver bug must not kill the reflector
            log.exception("%s: callback %s failed", self.name, getattr(fn, "__name__", fn))

    def _relist(self) -> None:
        items, rv = self.client.list_with_version(
            self.resource,
            namespace=self.namespace,
            field_selector=self.field_selector,
            label_selector=self.label_selector,
        )
        self.list_count += 1
        fresh = {object_key(o): o for o in items}
        with self._cache_lock:
            old = self._cache
            self._cache = fresh
        if self.on_sync is not None:
            self._call(self.on_sync, items)
        else:
            for key, obj in fresh.items():
                prev = old.get(key)
                if prev is None:
                    self._call(self.on_add, obj)
                elif meta_of(prev).get("resourceVersion") != meta_of(obj).get("resourceVersion"):
                    self._call(self.on_update, prev, obj)
            for key, obj in old.items():
                if key not in fresh:
                    self._call(self.on_delete, obj)
        self.resource_version = rv
        self._synced.set()

    def _apply(self, type_: str, obj: dict[str, Any]) -> None:
        rv = meta_of(obj).get("resourceVersion")
        if type_ == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        key = object_key(obj)
        if type_ in ("ADDED", "MODIFIED"):
            with self._cache_lock:
                prev = self._cache.get(key)
                self._cache[key] = obj
            if prev is None:
                self._call(self.on_add, obj)
            else:
                self._call(self.on_update, prev, obj)
        elif type_ == "DELETED":
            with self._cache_lock:
                prev = self._cache.pop(key, None)
            self._call(self.on_delete, obj if obj else prev)
        if rv:
            self.resource_version = rv

    def _run(self) -> None:
        # client-go's reflector backoff: doubling from backoff_initial_s, up to +20 % jitter.
        backoff = Backoff(self.backoff_initial_s, self.backoff_max_s, jitter=0.2, cap_jitter=False)
        failures = 0
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list or self._force_relist:
                    self._force_relist = False
                    self._relist()
                    need_list = False
                stream = self.client.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    namespace=self.namespace,
                    field_selector=self.field_selector,
                    label_selector=self.label_selector,
                    timeout_s=self.watch_timeout_s,
                )
                self.watch_count += 1
                self._stream = stream
                # stop()/resync() set their flag before looking at _stream; checking after the
                # assignment means one of the two sides always closes this stream.
                if self._stop.is_set() or self._force_relist:
                    stream.close()
                for type_, obj in stream:
                    if self._stop.is_set():
                        break
                    self._apply(type_, obj)
                    failures = 0
                self._stream = None
                # A watch that ends normally (server timeout, clean close) is resumed at once;
                # one closed by resync() leads to the relist at the top of the loop.
            except ResourceExpired as e:
                log.info("%s: %s; relisting", self.name, e)
                need_list = True
            except Exception as e:  # noqa: BLE001 - keep reflecting whatever went wrong
                self._stream = None
                if self._stop.is_set():
                    break
                failures += 1
                wait = backoff.delay(failures)
                log.warning("%s: %s; retrying in %.1fs", self.name, e, wait)
                self._stop.wait(wait)

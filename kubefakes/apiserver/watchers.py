"""Watch streams: the HTTP stream that drains one watcher's queue (`kubefakes.apiserver.table.Watcher`,
fed by the store).

A watch is a chunked JSON-lines response; bookmarks, the initial-events end marker, clean close
(`CLOSE_WATCH`) and abrupt reset (`ABORT_WATCH`) behave as on kube-apiserver.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kubefakes.apiserver.resources import JSON
from kubefakes.apiserver.selectors import (
    SelectorError,
    compile_matcher,
    parse_field_selector,
    parse_label_selector,
)
from kubefakes.apiserver.status import ApiStatusError, bad_request
from kubefakes.apiserver.table import Table

if TYPE_CHECKING:
    from kubefakes.apiserver.store import Store


CLOSE_WATCH = object()
ABORT_WATCH = object()


def truthy(value: str | None) -> bool:
    """A boolean query parameter as the API server reads it (``true`` or ``1``)."""
    return value is not None and value.lower() in ("true", "1")


async def serve_watch(
    request: web.Request,
    store: Store,
    table: Table,
    namespace: str | None,
    *,
    default_timeout_s: float,
    bookmark_interval_s: float,
    tasks: set[asyncio.Task[Any]],
) -> web.StreamResponse:
    """Answer one watch request: replay or initial events, then live events and bookmarks until the
    timeout (``timeoutSeconds`` or `default_timeout_s`), a close marker or the client leaving.

    A too-old resourceVersion is answered as the real server does: 200 and one ERROR event carrying a
    410 Expired Status. The running task is kept in `tasks` so the server can cancel it on stop.
    """
    q = request.query
    info = table.info
    try:
        matcher = compile_matcher(
            parse_label_selector(q.get("labelSelector")),
            parse_field_selector(q.get("fieldSelector"), info.field_labels),
        )
    except SelectorError as e:
        raise bad_request(str(e)) from None
    timeout = float(q.get("timeoutSeconds") or default_timeout_s)
    bookmarks = truthy(q.get("allowWatchBookmarks"))
    send_initial = truthy(q.get("sendInitialEvents"))
    resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
    resp.enable_chunked_encoding()
    try:
        watcher, lines = store.open_watch(table, namespace, matcher, q.get("resourceVersion"), send_initial)
    except ApiStatusError as e:
        if e.code != 410:
            raise
        # The real server answers 200 and sends the expiry as an ERROR event on the stream.
        await resp.prepare(request)
        await resp.write(json.dumps({"type": "ERROR", "object": e.body}).encode() + b"\n")
        await resp.write_eof()
        return resp
    task = asyncio.current_task()
    if task is not None:
        tasks.add(task)
    try:
        await resp.prepare(request)
        if lines:
            await resp.write(b"".join(lines))
        if send_initial and bookmarks:
            mark = {
                "kind": info.kind,
                "apiVersion": info.api_version,
                "metadata": {
                    "resourceVersion": str(watcher.start_rv),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            }
            await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + bookmark_interval_s
        while True:
            now = loop.time()
            if now >= deadline:
                break
            wait = deadline - now
            if bookmarks:
                wait = min(wait, max(0.0, next_bookmark - now))
            try:
                item = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
            except TimeoutError:
                if bookmarks and loop.time() >= next_bookmark:
                    rv = store.bookmark_rv(table)
                    if rv is not None and watcher.queue.empty():
                        mark = {
                            "kind": info.kind,
                            "apiVersion": info.api_version,
                            "metadata": {"resourceVersion": str(rv)},
                        }
                        await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
                    next_bookmark = loop.time() + bookmark_interval_s
                continue
            # Send everything queued up to a close marker in one write; what follows a marker
            # is not sent (the connection ends there, as a real drop would).
            payload: list[bytes] = []
            marker = None
            while True:
                if isinstance(item, bytes):
                    payload.append(item)
                else:
                    marker = item
                    break
                if watcher.queue.empty():
                    break
                item = watcher.queue.get_nowait()
            if payload:
                await resp.write(b"".join(payload))
            if marker is ABORT_WATCH:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            if marker is CLOSE_WATCH:
                break
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass
    finally:
        store.close_watch(watcher)
        if task is not None:
            tasks.discard(task)
    return resp

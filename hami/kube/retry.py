"""The project's one retry policy: what is worth another try, how long to wait, and how often.

Every retry loop that talks to the API server or to kubelet goes through here (`tenacity`
underneath), so the rules are written once:

* API calls (`call_with_retries`): retried on 429 (honouring ``Retry-After``), 5xx and transport
  errors, and on 409 only where the call carries no precondition (a re-read on the server side is
  then what the caller wants). Never on 400/403/404/422: those are answers, not accidents. Errors
  map to `hami.errors`: 404 -> `NotFound`, 409 -> `Conflict`, 400/422 -> `InvalidRequest`,
  410 -> `ResourceExpired`, anything else left after the retries -> `ApiError`; each carries
  ``status`` and ``reason`` attributes and the server's message.
* Waits (`Backoff`): exponential with multiplicative jitter, capped; the first failure may be
  retried at once (the node lock: one conflict usually means a fresh read finds the node free).

Only `hami.kube` imports `tenacity`, `urllib3` and `kubernetes`; code elsewhere uses this module's
`Backoff`, `retry_call` and `retry_call_async`.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity
import urllib3
from kubernetes.client.exceptions import ApiException

from hami.errors import ApiError, Conflict, HamiError, InvalidRequest, NotFound, ResourceExpired

T = TypeVar("T")

#: Transport failures worth another try: the request may not have reached the server.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    urllib3.exceptions.HTTPError,  # MaxRetryError, ProtocolError, ReadTimeoutError, NewConnectionError, ...
    ConnectionError,
    TimeoutError,
)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Seconds to wait after the n-th consecutive failure.

    ``initial_s * factor ** (n - 1)``, capped at `max_s`, then stretched by up to `jitter` (0.5 = up
    to +50 %) and, when `cap_jitter`, capped again. With `immediate_first` the first failure waits 0
    and the series starts at the second one.
    """

    initial_s: float
    max_s: float = math.inf
    factor: float = 2.0
    jitter: float = 0.0
    immediate_first: bool = False
    cap_jitter: bool = True

    def delay(self, failures: int, *, at_least_s: float | None = None) -> float:
        """Seconds after the `failures`-th failure (1-based); `at_least_s` (a ``Retry-After``) is
        honoured up to `max_s`."""
        n = failures - 1 if self.immediate_first else failures
        if n < 1:
            return 0.0
        wait = min(self.max_s, self.initial_s * self.factor ** (n - 1))
        if self.jitter:
            wait *= 1 + random.random() * self.jitter
        if at_least_s is not None:
            wait = max(wait, at_least_s)
        return min(wait, self.max_s) if self.cap_jitter else wait


def retry_call(
    fn: Callable[[], T],
    *,
    retry_on: tuple[type[BaseException], ...],
    retries: int,
    backoff: Backoff,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Call `fn`; on one of `retry_on`, wait `backoff` and call again, at most `retries` more times.

    The last failure is re-raised as it was. `on_retry(failures, exc)` runs before each wait
    (logging). The first try runs bare: tenacity's bookkeeping is only paid when something failed.
    """
    try:
        return fn()
    except retry_on as e:
        if retries < 1:
            raise
        first = e
    if on_retry is not None:
        on_retry(1, first)
    sleep(backoff.delay(1))
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(retry_on),
        stop=tenacity.stop_after_attempt(retries),
        wait=lambda state: backoff.delay(state.attempt_number + 1),
        sleep=sleep,
        before_sleep=_before_sleep(on_retry, offset=1),
        reraise=True,
    )
    return retrying(fn)


async def retry_call_async(
    fn: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    backoff: Backoff,
    retries: int | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """`retry_call` for coroutines; `retries` None retries until success or cancellation."""
    kwargs: dict[str, Any] = {}
    if sleep is not None:
        kwargs["sleep"] = sleep
    retrying = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(retry_on),
        stop=tenacity.stop_never if retries is None else tenacity.stop_after_attempt(retries + 1),
        wait=lambda state: backoff.delay(state.attempt_number),
        before_sleep=_before_sleep(on_retry, offset=0),
        reraise=True,
        **kwargs,
    )
    return await retrying(fn)


def _before_sleep(
    on_retry: Callable[[int, BaseException], None] | None, *, offset: int
) -> Callable[[tenacity.RetryCallState], None] | None:
    if on_retry is None:
        return None

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None:
            on_retry(state.attempt_number + offset, exc)

    return before_sleep


# -- API errors ------------------------------------------------------------------------------------


class Retryable(Exception):
    """A failed API call worth another try; `error` is what the caller gets if tries run out."""

    def __init__(self, error: HamiError, retry_after_s: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after_s = retry_after_s


def status_of(exc: ApiException) -> tuple[str, str]:
    """(reason, message) from an ApiException's Status body, falling back to the HTTP reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (ValueError, TypeError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    return str(body.get("reason") or exc.reason or ""), str(
        body.get("message") or exc.reason or f"HTTP {exc.status}"
    )


def map_api_exception(exc: ApiException, what: str) -> HamiError:
    """The `hami.errors` type for an API answer (see module docstring); message ``<what>: <server's>``."""
    reason, message = status_of(exc)
    status = exc.status
    text = f"{what}: {message}"
    err: HamiError
    if status == 404:
        err = NotFound(text)
    elif status == 409:
        err = Conflict(text)
    elif status in (400, 422):
        err = InvalidRequest(text)
    elif status == 410:
        err = ResourceExpired(text, status=status, reason=reason)
    else:
        err = ApiError(text, status=status, reason=reason)
    err.status = status  # type: ignore[attr-defined]
    err.reason = reason  # type: ignore[attr-defined]
    return err


def retry_after(exc: ApiException) -> float | None:
    """The ``Retry-After`` header in seconds, None when absent or not a number."""
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def classify(exc: ApiException, what: str, retry_conflict: bool) -> Exception:
    """The mapped error, wrapped in `Retryable` for 429, 5xx and (when `retry_conflict`) 409."""
    err = map_api_exception(exc, what)
    status = exc.status or 0
    if status == 429 or status >= 500 or (status == 409 and retry_conflict):
        return Retryable(err, retry_after(exc))
    return err


def transport_error(what: str, exc: BaseException) -> Retryable:
    """A transport failure as a retryable `ApiError` (reason ``Transport``)."""
    return Retryable(ApiError(f"{what}: cannot reach the API server: {exc}", reason="Transport"))


def _api_waits(initial_wait_s: float, max_wait_s: float) -> Callable[[BaseException | None], float]:
    """Seconds to wait after each consecutive failure of one API call: jittered exponential backoff,
    a ``Retry-After`` honoured up to `max_wait_s`."""
    backoff = Backoff(initial_wait_s, max_wait_s, jitter=0.5)
    failures = 0

    def wait_after(exc: BaseException | None) -> float:
        nonlocal failures
        failures += 1
        after = exc.retry_after_s if isinstance(exc, Retryable) else None
        return backoff.delay(failures, at_least_s=after)

    return wait_after


def call_with_retries(
    attempt: Callable[[], T], *, retries: int, initial_wait_s: float, max_wait_s: float
) -> T:
    """Run one API call's `attempt` (which raises `Retryable` for what is worth another try) up to
    `retries` more times with jittered exponential backoff and ``Retry-After`` honoured; the final
    failure raises the mapped `hami.errors` type."""
    wait_after = _api_waits(initial_wait_s, max_wait_s)

    # The first try runs bare: tenacity's bookkeeping is only paid when something failed.
    try:
        return attempt()
    except Retryable as e:
        if retries < 1:
            raise e.error from None
        time.sleep(wait_after(e))
    try:
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Retryable),
            stop=tenacity.stop_after_attempt(retries),
            wait=lambda rs: wait_after(rs.outcome.exception() if rs.outcome else None),
            reraise=True,
        )(attempt)
    except Retryable as e:
        raise e.error from None


async def acall_with_retries(
    attempt: Callable[[], Awaitable[T]], *, retries: int, initial_wait_s: float, max_wait_s: float
) -> T:
    """`call_with_retries` for a coroutine `attempt` (`hami.kube.aio`): the same policy, waits on the
    event loop."""
    wait_after = _api_waits(initial_wait_s, max_wait_s)
    try:
        return await attempt()
    except Retryable as e:
        if retries < 1:
            raise e.error from None
        await asyncio.sleep(wait_after(e))
    try:
        return await tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(Retryable),
            stop=tenacity.stop_after_attempt(retries),
            wait=lambda rs: wait_after(rs.outcome.exception() if rs.outcome else None),
            reraise=True,
        )(attempt)
    except Retryable as e:
        raise e.error from None

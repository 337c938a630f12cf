"""Keeping Python's full garbage collections from stalling filter and bind.

Why: the extender holds every Node and Pod of the cluster in its watch caches and in ClusterState -
millions of container objects. CPython's full (generation 2) collection walks all of them, and on the
1213-node benchmark cluster each one stopped every thread for 100-150 ms; a handful per minute made the
filter p99 at a steady 100 pods/s 65 ms instead of single-digit milliseconds.

What: `GcFreezer` runs a young collection (generations 0 and 1: the short-lived request garbage, a few
ms) and then `gc.freeze()` every `interval_s`, which moves every surviving object out of the collector's
view, so the full collections that still happen only walk what was created since. Frozen objects are
still freed by reference counting (the pods and nodes a watch event replaces are); what freezing can
keep alive is cyclic garbage that was already old, so every `full_interval_s` the freezer unfreezes,
runs one full collection (one pause of the old size) and freezes again.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger(__name__)


class GcFreezer:
    """A daemon thread: `tick()` every `interval_s` seconds, `full()` every `full_interval_s` seconds."""

    def __init__(self, interval_s: float = 10.0, full_interval_s: float = 3600.0) -> None:
        if interval_s <= 0 or full_interval_s < interval_s:
            raise ValueError(
                f"gc freeze: want 0 < interval_s <= full_interval_s, got {interval_s} and {full_interval_s}"
            )
        self.interval_s = interval_s
        self.full_interval_s = full_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def tick() -> float:
        """Collect the young generations, then freeze everything left. Returns the pause in seconds."""
        t0 = time.perf_counter()
        gc.collect(1)
        gc.freeze()
        return time.perf_counter() - t0

    @staticmethod
    def full() -> float:
        """Unfreeze, collect everything, freeze again. Returns the pause in seconds."""
        t0 = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        return time.perf_counter() - t0

    def start(self) -> GcFreezer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gc-freezer", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        last_full = time.monotonic()
        while not self._stop.wait(self.interval_s):
            if time.monotonic() - last_full >= self.full_interval_s:
                pause = self.full()
                last_full = time.monotonic()
                log.debug(
                    "full garbage collection: %.0f ms, %d objects frozen", pause * 1000, gc.get_freeze_count()
                )
            else:
                self.tick()

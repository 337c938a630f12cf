"""One CUDA MPS control daemon per card served in `mps` mode, run by the device plugin and restarted
when it dies.

Each card's daemon is ``nvidia-cuda-mps-control -f`` (foreground, so the plugin is its parent and
sees it exit) with ``CUDA_VISIBLE_DEVICES=<card UUID>`` and the card's own pipe and log directories
``<root>/<card UUID>/pipe`` and ``.../log`` (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``);
containers on the card mount those directories. The card's compute mode is left as it is (NVIDIA
recommends EXCLUSIVE_PROCESS for MPS, which an administrator may set; MPS works in DEFAULT mode too).
A daemon that exits is started again after a back-off (1 s, doubling to 30 s, reset after it ran a
minute); at shutdown it is asked to ``quit`` through its control pipe, then terminated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"


class MpsDaemon:
    """The MPS control daemon of one card."""

    def __init__(
        self,
        card_uuid: str,
        root: str | Path,
        *,
        control: str = CONTROL,
        backoff_s: tuple[float, float] = (1.0, 30.0),
        stable_s: float = 60.0,
    ) -> None:
        self.card_uuid = card_uuid
        self.dir = Path(root) / card_uuid
        self.pipe_dir = self.dir / "pipe"
        self.log_dir = self.dir / "log"
        self.control = control
        self.backoff_s = backoff_s
        self.stable_s = stable_s
        self.restarts = 0
        self.proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._started = asyncio.Event()

    def env(self) -> dict[str, str]:
        """The daemon's (and its client commands') environment."""
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": self.card_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def run(self) -> None:
        """Keep the daemon running until `stop` (or cancellation). Never raises for a daemon that
        cannot start: it logs, waits and tries again."""
        delay = self.backoff_s[0]
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._spawn()
                rc = await self.proc.wait()  # type: ignore[union-attr]
            except OSError as e:
                rc = None
                log.error("card %s: cannot start %s: %s", self.card_uuid, self.control, e)
            if self._stopping:
                return
            if time.monotonic() - started > self.stable_s:
                delay = self.backoff_s[0]
            self.restarts += 1
            log.warning(
                "card %s: MPS control daemon exited (status %s); starting it again in %.0f s (log: %s)",
                self.card_uuid, rc, delay, self.log_dir,
            )  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_s[1])

    async def _spawn(self) -> None:
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(PermissionError):
                os.chmod(d, 0o777)  # noqa: S103 - container users connect to the pipe and write client logs
        # In the foreground the daemon may write its messages to the terminal: keep them beside its log.
        with open(self.log_dir / "daemon.out", "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                self.control, "-f", env=self.env(), stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip
        log.info(
            "card %s: MPS control daemon started (pid %d, pipe %s)",
            self.card_uuid,
            self.proc.pid,
            self.pipe_dir,
        )
        self._started.set()

    async def ready(self, timeout: float = 10.0) -> bool:
        """Whether the daemon runs and its control pipe is there (waiting up to `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.running and (self.pipe_dir / "control").exists():
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask the daemon to quit through its pipe, then terminate it if it does not."""
        self._stopping = True
        if not self.running:
            return
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            quit_cmd = await asyncio.create_subprocess_exec(
                self.control, env=self.env(), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.wait_for(quit_cmd.communicate(b"quit\n"), timeout)
        proc = self.proc
        try:
            await asyncio.wait_for(proc.wait(), timeout)  # type: ignore[union-attr]
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # type: ignore[union-attr]
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout)  # type: ignore[union-attr]


class MpsDaemons:
    """The daemons of every card served in `mps` mode, run as background tasks."""

    def __init__(self, cards: Iterable[str], root: str | Path, *, control: str = CONTROL) -> None:
        self.root = Path(root)
        self.daemons = {u: MpsDaemon(u, root, control=control) for u in cards}
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        for d in self.daemons.values():
            self._tasks.append(asyncio.create_task(d.run(), name=f"mps-{d.card_uuid}"))

    def get(self, card_uuid: str) -> MpsDaemon | None:
        return self.daemons.get(card_uuid)

    async def stop(self) -> None:
        await asyncio.gather(*(d.stop() for d in self.daemons.values()), return_exceptions=True)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()

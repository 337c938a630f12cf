"""Loaders for the openb CSV format of the Alibaba GPU cluster trace v2023 (../shared/data/alibaba-gpu-v2023).

Why strict: a silently skipped or zeroed row changes every figure the simulator prints, so each malformed
row is a `TraceError` naming the file, the line (1 = header) and the column. Extra columns are ignored;
the time columns are optional (the `multigpu` lists have none), and only `--mode trace` needs them.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from pathlib import Path

from hami.config import DeviceConfig
from hami.simulate.workload import DEFAULT_GPU_MODELS, SimNode, SimPod, TraceError, gpu_node, openb_pod

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "creation_time", "deletion_time")

#: Largest CPU (millicores) or memory (MiB) a row may state: 2^50, far above any machine, and small
#: enough for the engine's 64-bit per-node arrays (a larger value would overflow them).
MAX_QUANTITY = 1 << 50

# Plain ASCII numbers only: Python's int()/float() would also take "1_000", "١٠٠٠", "inf" or "1e3",
# which no trace writes and which most likely mean a shifted or corrupted column.
_INTEGER = re.compile(r"-?[0-9]+")
_UNCLOSED = 'a quote (") opened on this line is not closed on it'
_SECONDS = re.compile(r"-?[0-9]+(\.[0-9]*)?|-?\.[0-9]+")


class _Rows:
    """A CSV file read as (line number, {column: value}) with errors naming file, line and column."""

    def __init__(self, path: str | Path, required: tuple[str, ...]) -> None:
        self.source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8-sig")
        except OSError as e:
            raise TraceError(self.source, None, f"cannot read: {e.strerror}") from None
        except UnicodeDecodeError:
            raise TraceError(self.source, None, "not a UTF-8 text file") from None
        self.reader = csv.reader(text.splitlines(), strict=True)
        try:
            header = next(self.reader, None)
        except csv.Error as e:
            raise TraceError(self.source, 1, f"not CSV: {e}") from None
        if header is None:
            raise TraceError(
                self.source, 1, f"empty file; expected a header with columns {', '.join(required)}"
            )
        self.header = [h.strip() for h in header]
        for i, h in enumerate(self.header):
            if h in required + POD_OPTIONAL and self.header.index(h) != i:
                raise TraceError(
                    self.source,
                    1,
                    f"column {i + 1} ({h}): duplicate column, first as column {self.header.index(h) + 1}",
                )
        missing = [c for c in required if c not in self.header]
        if missing:
            raise TraceError(
                self.source,
                1,
                f"header lacks column {', '.join(missing)}; expected columns {', '.join(required)} "
                f"(found {', '.join(self.header) or 'none'})",
            )
        self.index = {c: i for i, c in enumerate(self.header)}

    def __iter__(self):
        start = self.reader.line_num + 1
        while True:
            try:
                row = next(self.reader)
            except StopIteration:
                return
            except csv.Error as e:
                if "unexpected end of data" in str(e):
                    raise TraceError(self.source, start, _UNCLOSED) from None
                raise TraceError(self.source, self.reader.line_num, f"not CSV: {e}") from None
            n, start = start, self.reader.line_num + 1
            if self.reader.line_num > n:
                # Only a quoted field can span lines; no openb file has one, so it is an unclosed quote.
                raise TraceError(self.source, n, _UNCLOSED)
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < len(self.header):
                short = len(row)
                raise TraceError(
                    self.source,
                    n,
                    f"column {short + 1} ({self.header[short]}) is missing: the row has {short} "
                    f"column{'s' if short != 1 else ''}, the header {len(self.header)}",
                )
            yield n, row

    def has(self, column: str) -> bool:
        return column in self.index

    def get(self, row: list[str], column: str) -> str:
        return row[self.index[column]].strip()

    def error(self, line: int, column: str, message: str) -> TraceError:
        return TraceError(self.source, line, f"column {self.index[column] + 1} ({column}): {message}")

    def integer(
        self, row: list[str], line: int, column: str, *, low: int = 0, high: int = MAX_QUANTITY
    ) -> int:
        raw = self.get(row, column)
        valid = f"{low}..{high}" if high != MAX_QUANTITY else f"an integer from {low} to 2^50"
        if raw == "":
            raise self.error(line, column, f"empty; valid: {valid}")
        if not _INTEGER.fullmatch(raw):
            raise self.error(line, column, f"{raw!r} is not an integer")
        value = int(raw)
        if value < low or value > high:
            raise self.error(line, column, f"{value} is out of range; valid: {valid}")
        return value

    def name(self, row: list[str], line: int, column: str, kind: str) -> str:
        value = self.get(row, column)
        if not value:
            raise self.error(line, column, f"empty {kind} name")
        if not value.isprintable():
            raise self.error(line, column, f"{value!r}: a {kind} name must not hold control characters")
        return value

    def time(self, row: list[str], line: int, column: str) -> float | None:
        if not self.has(column):
            return None
        raw = self.get(row, column)
        if raw == "":
            return None
        if not _SECONDS.fullmatch(raw):
            raise self.error(line, column, f"{raw!r} is not a number of seconds")
        value = float(raw)
        if value < 0 or not math.isfinite(value):
            raise self.error(line, column, f"{raw!r} must be a number of seconds >= 0")
        return value


def load_nodes(
    path: str | Path, *, config: DeviceConfig, gpu_models: Mapping[str, int] = DEFAULT_GPU_MODELS
) -> list[SimNode]:
    """Read `sn,cpu_milli,memory_mib,gpu,model` rows into nodes (cards registered as `NVIDIA-<model>`).

    A node with ``gpu == 0`` is a CPU-only node (no registration annotation). Raises TraceError for a
    missing column, a number that is not plain ASCII digits or is out of range (CPU/memory 0..2^50, `gpu`
    0..1024), a duplicate or unprintable `sn`, or a GPU node whose `model` is not in `gpu_models` (the
    message lists the known models and the `--gpu-models` flag). Also for the file itself: unreadable,
    not UTF-8, empty, header only, a column named twice, an unclosed quote.
    """
    rows = _Rows(path, NODE_COLUMNS)
    nodes: list[SimNode] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        name = rows.name(row, line, "sn", "node")
        if any(c in name for c in ",:;"):
            raise rows.error(line, "sn", f"{name!r} must not contain ',', ':' or ';'")
        if name in seen:
            raise rows.error(line, "sn", f"duplicate node {name!r} (first on line {seen[name]})")
        seen[name] = line
        cpu = rows.integer(row, line, "cpu_milli")
        mem = rows.integer(row, line, "memory_mib")
        gpus = rows.integer(row, line, "gpu", high=1024)
        model = rows.get(row, "model")
        if gpus > 0 and model not in gpu_models:
            raise rows.error(
                line,
                "model",
                f"unknown GPU model {model!r}; known: {', '.join(sorted(gpu_models))} "
                "(add it with --gpu-models MODEL=MiB)",
            )
        card_mib = gpu_models.get(model, 0)
        nodes.append(
            gpu_node(
                name, cpu_milli=cpu, memory_mib=mem, gpus=gpus, model=model, card_mib=card_mib, config=config
            )
        )
    if not nodes:
        raise TraceError(rows.source, 2, "no node rows after the header")
    return nodes


def load_pods(
    path: str | Path, *, config: DeviceConfig, gpu_models: Mapping[str, int] = DEFAULT_GPU_MODELS
) -> list[SimPod]:
    """Read openb pod rows (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...,creation_time,
    deletion_time]`) into pods with HAMi requests (mapping in `hami.simulate.workload.openb_pod`).

    Raises TraceError for: a missing required column; a number that is not plain ASCII digits or is out
    of range (CPU/memory 0..2^50, times finite decimals >= 0); `num_gpu` above 64; `gpu_milli` outside 0..1000, non-zero on a CPU-only row or zero on a GPU row; a duplicate name;
    `deletion_time` before `creation_time`. An unknown model in `gpu_spec` is NOT an error: that pod is
    unplaceable with the reason.
    """
    rows = _Rows(path, POD_COLUMNS)
    pods: list[SimPod] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        name = rows.name(row, line, "name", "pod")
        if name in seen:
            raise rows.error(line, "name", f"duplicate pod {name!r} (first on line {seen[name]})")
        seen[name] = line
        cpu = rows.integer(row, line, "cpu_milli")
        mem = rows.integer(row, line, "memory_mib")
        num_gpu = rows.integer(row, line, "num_gpu", high=64)
        gpu_milli = rows.integer(row, line, "gpu_milli", high=1000)
        if num_gpu == 0 and gpu_milli != 0:
            raise rows.error(
                line, "gpu_milli", f"{gpu_milli} on a row with num_gpu 0; a CPU-only pod has gpu_milli 0"
            )
        if num_gpu > 0 and gpu_milli == 0:
            raise rows.error(line, "gpu_milli", f"0 on a row with num_gpu {num_gpu}; valid: 1..1000")
        spec = rows.get(row, "gpu_spec").split("|") if rows.has("gpu_spec") else []
        created = rows.time(row, line, "creation_time")
        deleted = rows.time(row, line, "deletion_time")
        if created is not None and deleted is not None and deleted < created:
            raise rows.error(line, "deletion_time", f"{deleted:g} is before creation_time {created:g}")
        pods.append(
            openb_pod(
                name,
                cpu_milli=cpu,
                memory_mib=mem,
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=[s.strip() for s in spec],
                config=config,
                gpu_models=gpu_models,
                creation_time=created,
                deletion_time=deleted,
            )
        )
    if not pods:
        raise TraceError(rows.source, 2, "no pod rows after the header")
    return pods

"""The buckets of a partitioned plan: each bucket's policy input, kept in memory or spilled to disk.

A partitioned run (``buckets`` > 1) is planned with the policy's steps: several passes over
every bucket (``policies.steps``). :class:`Buckets` reads a bucket's input when a pass asks for
it (its table file's rows plus the population's samples the table lacks), keeps it between
passes while the inputs fit in :data:`_INPUT_CACHE_BYTES`, with what the steps derive from it
(``PolicyInput.memo``), and spills the others once as .npy files with their memo
(``_SpilledMemo``), memory-mapped by later passes. Part of planning
(``seta_stream._planning``; ``transaction`` runs the passes).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .._kernels.arrays import column_to_numpy, is_broadcast
from .._store.layout import MANIFEST
from .._store.planfiles import PlanIdentities
from .._store.runfs import RunDir
from .._store.table import empty_table, read_bucket, read_bucket_numeric, table_buckets
from ..errors import RunFormatError
from ..policies import PolicyInput
from ..policies.steps import PlanContext
from .population import HISTORY_INPUTS, TABLE_COLUMNS, merge_population

__all__ = ["Buckets"]

#: Bytes of bucket inputs a partitioned plan keeps between its passes (buckets past it are
#: read again from their files at each pass); what the steps derive from a kept bucket
#: (``PolicyInput.memo``, up to about 0.7 of it) comes on top.
_INPUT_CACHE_BYTES = 1 << 29


class Buckets:
    """The buckets of a partitioned plan: each bucket's policy input (its table file's rows
    plus the population's samples the table lacks), read when asked and kept while they fit
    in :data:`_INPUT_CACHE_BYTES`, and its identity columns for the plan files.

    The steps' passes get the columns the policy declares (``columns``); the rows pass, which
    writes the plan files and counts the summary, also gets the other plan columns
    (``row_columns``), read from the bucket's file with its identity columns. Why: the
    uniform-draw policies declare only the uid, and keeping or spilling the loss and seen
    columns of every bucket for their passes (16 bytes a sample instead of 8) cost about a
    fifth of a dynamic random plan at 200M samples (docs/benchmarks.md, "Web scale"). With a
    population the merged rows are kept whole (merging again would cost more)."""

    def __init__(
        self,
        run: RunDir,
        manifest: dict[str, Any],
        columns: list[str],
        population: list[pa.Table] | None,
        row_columns: list[str] | None = None,
    ) -> None:
        row_columns = row_columns or columns
        #: the table columns merged with a population (the history ones only when declared)
        self.merged_columns = TABLE_COLUMNS + [c for c in HISTORY_INPUTS if c in set(columns) | set(row_columns)]
        if population is not None:
            columns = sorted(set(columns) | set(row_columns))
        self.run, self.columns, self.population = run, columns, population
        #: the plan columns the rows pass reads beside the identities
        self.extra = [c for c in row_columns if c not in columns]
        self._rows_ids: dict[int, PlanIdentities] = {}
        self.count = run.buckets
        self.files = table_buckets(manifest) or [None] * self.count
        if len(self.files) != self.count:
            raise RunFormatError(
                f"{run.display(MANIFEST)}: the table has {len(self.files)} buckets, the run's settings say "
                f"{self.count}; expected the same (buckets are fixed when the run is created)"
            )
        self.context: PlanContext | None = None
        self._cache: dict[int, dict[str, np.ndarray]] = {}
        self._memo: dict[int, dict[str, Any]] = {}
        self._cached = 0
        self._lock = threading.Lock()  # buckets are read on several threads (ThreadEngine)
        #: buckets past the cache: their input columns as .npy files in a scratch folder
        #: (TMPDIR), memory-mapped by later passes: 3-4x cheaper than decoding Parquet again
        self._spill: Any = tempfile.TemporaryDirectory(prefix="seta-stream-plan-")
        self._spilled: dict[int, dict[str, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Without the cache or the spill (a Ray task reads the buckets it is given)."""
        return {
            **self.__dict__,
            "_cache": {},
            "_memo": {},
            "_cached": 0,
            "_spill": None,
            "_spilled": {},
            "_rows_ids": {},
            "_lock": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._spill is not None:
            self._spill.cleanup()

    def _table(self, b: int, columns: list[str]) -> pa.Table:
        bucket = self.files[b]
        return empty_table(columns) if bucket is None else read_bucket(self.run, bucket, columns)[0]

    def _merged(self, b: int) -> pa.Table:
        return merge_population(self._table(b, self.merged_columns), self.population[b])

    def numeric(self, b: int) -> dict[str, np.ndarray]:
        cols = self._cache.get(b)
        if cols is not None:
            return cols
        if b in self._spilled:
            return {name: np.load(path, mmap_mode="r") for name, path in self._spilled[b].items()}
        if self.population is not None:
            merged = self._merged(b)
            cols = {c: column_to_numpy(merged.column(c)) for c in self.columns}
        elif self.files[b] is None:
            cols = {c: column_to_numpy(self._table(b, self.columns).column(c)) for c in self.columns}
        else:
            cols = read_bucket_numeric(self.run, self.files[b], self.columns)
        size = sum(a.nbytes for a in cols.values())
        with self._lock:
            cache = self._cached + size <= _INPUT_CACHE_BYTES
            if cache:
                self._cached += size
        if cache:
            self._memo[b] = {}
            self._cache[b] = cols
        elif self._spill is not None:  # later passes map the arrays instead of decoding Parquet
            self._spilled[b] = self._spill_arrays(b, cols)
            self._memo[b] = _SpilledMemo(os.path.join(self._spill.name, f"b{b:05d}-memo"))
        return cols

    def release(self, b: int) -> None:
        """Forget bucket b's input and what the steps derived from it (its spilled files are
        removed), once its plan rows are written: the rows pass holds less memory and the
        scratch folder is emptied bucket by bucket instead of all at the end (about 3 s at 200M
        samples, on this process's last step). A bucket asked for again (the empty-plan guard
        writes every bucket again) is read again from its file."""
        cols = self._cache.pop(b, None)
        if cols is not None:
            with self._lock:
                self._cached -= sum(a.nbytes for a in cols.values())
        memo = self._memo.pop(b, None)
        if isinstance(memo, _SpilledMemo):
            memo.remove()
        for path in (self._spilled.pop(b, None) or {}).values():
            os.unlink(path)

    def count_rows(self, b: int) -> int:
        """Bucket b's number of rows (its input read, and kept or spilled for the passes)."""
        return len(self.numeric(b)["uid"])

    def _spill_arrays(self, b: int, cols: dict[str, np.ndarray]) -> dict[str, str]:
        paths = {}
        for name, array in cols.items():
            paths[name] = os.path.join(self._spill.name, f"b{b:05d}-{name}.npy")
            np.save(paths[name], np.ascontiguousarray(array))
        return paths

    def input(self, b: int) -> PolicyInput:
        """Bucket b's policy input; a bucket kept in memory also keeps what the policy's steps
        derive from it (``PolicyInput.memo``) until the plan is written."""
        return self._policy_input(b, self.numeric(b))

    def rows_input(self, b: int) -> PolicyInput:
        """Bucket b's input for the rows pass: :meth:`input` and the plan columns the policy
        does not declare, read with the identity columns (which :meth:`identities` then gives)."""
        cols = self.numeric(b)
        if self.extra:
            t = self._table(b, ["shard", "key", *self.extra])
            self._rows_ids[b] = PlanIdentities(t.column("shard"), t.column("key"))
            cols = {**cols, **{c: column_to_numpy(t.column(c)) for c in self.extra}}
        return self._policy_input(b, cols)

    def _policy_input(self, b: int, cols: dict[str, np.ndarray]) -> PolicyInput:
        """A PolicyInput of bucket b's ``cols`` (read by :meth:`numeric`, which sets its memo)."""
        ctx = self.context
        assert ctx is not None
        return PolicyInput.from_columns(
            cols, epoch=ctx.epoch, epochs=ctx.epochs, seed=ctx.seed, n_ref=ctx.n_ref, memo=self._memo.get(b)
        )

    def identities(self, b: int) -> PlanIdentities:
        ids = self._rows_ids.pop(b, None)
        if ids is not None:
            return ids
        t = self._merged(b) if self.population is not None else self._table(b, ["shard", "key"])
        return PlanIdentities(t.column("shard"), t.column("key"))


class _SpilledMemo(dict):  # type: ignore[type-arg]
    """``PolicyInput.memo`` of a spilled bucket: what the steps derive from its rows, arrays
    saved as .npy files beside its spilled columns and memory-mapped (read-only) when a later
    pass asks; other values, and constant arrays (a broadcast value: nothing to save), kept as
    they are.

    Why: without a memo every pass derives them again, and at 100M samples (12 buckets, 11 of
    them spilled) a SeTa plan computed each bucket's uniform keys (a 64-bit mix of every uid)
    and its sets about four times: 52 calls of ``mix64_array`` (5.5 s) where one per bucket
    does (docs/benchmarks.md, "Web scale").
    """

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self._files = 0

    def remove(self) -> None:
        """Remove the files saved so far (the memo is not used again)."""
        for i in range(self._files):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.prefix}-{i}.npy")
        self.clear()

    def _save(self, value: Any) -> Any:
        if isinstance(value, np.ndarray) and not is_broadcast(value):  # a constant stays one
            path = f"{self.prefix}-{self._files}.npy"
            self._files += 1
            np.save(path, np.ascontiguousarray(value))
            return _Saved(path)
        if isinstance(value, tuple):
            return tuple(self._save(v) for v in value)
        return value

    def _load(self, value: Any) -> Any:
        if isinstance(value, _Saved):
            return np.load(value.path, mmap_mode="r")
        if isinstance(value, tuple):
            return tuple(self._load(v) for v in value)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, self._save(value))

    def __getitem__(self, key: str) -> Any:
        return self._load(super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


@dataclass(frozen=True)
class _Saved:
    path: str

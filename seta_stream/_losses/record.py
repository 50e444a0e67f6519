"""LossRecorder: per-sample losses from the training loop into immutable Parquet parts.

One recorder per rank (in the main process) writes the loss parts of ``losses/rank=R/``,
which nobody modifies afterwards; their format (schema, name, metadata) is ``parts``'s
(docs/format.md, "Loss parts"). Invariant: every published part is complete (written under a
temporary name, then renamed) and its ``seq`` values are strictly greater than those of every
earlier part of the same rank, also across restarts (``seq`` starts at the wall-clock time in
ns when the recorder opens; a rank records far fewer than 10^9 samples per second, so a later
recorder always starts above an earlier one's last ``seq``).

``record()`` only validates lengths, shape, dtype and string types and appends references to a
buffer (no device sync, no conversion); ``flush()`` converts the buffered losses to float32 (one
device-to-host copy), maps urls to shard names (computed once per distinct ``__url__``) and
publishes one part (``parts.make_part`` computes the uids, ``parts.write_part`` publishes).

What a crash can lose: the unflushed buffer, at most ``flush_rows`` records (plus the batch
that crossed the threshold) per rank. On a normal interpreter exit, including one that never
calls ``close()``, the buffer is flushed by an ``atexit`` hook (held through a weak reference,
so the hook does not keep the recorder alive); a recorder garbage-collected without ``close()``
flushes in its finaliser.

Non-finite losses (NaN, +-inf) are stored as NaN and counted in ``stats["nonfinite"]``; the
loss table counts them per sample and the policies treat such samples as unseen.
"""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .._store.layout import MANIFEST
from .._store.parts import make_part, write_part
from .._store.runfs import RunDir
from .._store.table import table_locations
from ..errors import InvalidInputError, PopulationLocationError, ShardNameConflictError
from ..ids import ShardLocations, depth_hint, shard_location, shard_name

__all__ = ["LossRecorder"]


def _dist_rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _loss_length(loss: Any) -> tuple[int, str]:
    """(number of per-sample values, kind) without copying or syncing a device."""
    shape = tuple(getattr(loss, "shape", ()))
    kind = type(loss).__module__.split(".", 1)[0]
    if kind == "torch":
        if not loss.is_floating_point():
            raise InvalidInputError(f"loss tensor has dtype {loss.dtype}; expected a floating point per-sample loss")
    elif isinstance(loss, np.ndarray):
        if not np.issubdtype(loss.dtype, np.floating):
            raise InvalidInputError(f"loss array has dtype {loss.dtype}; expected a floating point per-sample loss")
    else:
        raise InvalidInputError(
            f"loss is a {type(loss).__name__}; expected a torch tensor or numpy array with one value per sample"
        )
    if len(shape) == 1:
        return shape[0], kind
    if len(shape) == 2 and shape[1] == 1:
        return shape[0], kind
    raise InvalidInputError(
        f"loss has shape {shape}; expected one value per sample, shape (batch,) or (batch, 1). "
        "Compute it with reduction='none' (and average token losses per sample)"
    )


class LossRecorder:
    """Buffer per-sample losses and write them as Parquet parts of a run directory.

    Args:
        run: run directory (path, fsspec URL or RunDir); created if missing.
        rank: writer rank (default: torch.distributed rank if initialised, else 0).
        epoch: epoch of the records until :meth:`set_epoch` changes it.
        flush_rows: records buffered before a part is written.
        population_locations: ``{shard name: location}`` of the population the run is planned
            from (:class:`~seta_stream.Pruner` passes its population's): a recorded ``__url__``
            whose shard the population lists at another location stops ``record()`` with
            :class:`~seta_stream.errors.PopulationLocationError` before anything is buffered.
    """

    def __init__(
        self,
        run: str | RunDir,
        *,
        rank: int | None = None,
        epoch: int = 0,
        flush_rows: int = 65536,
        storage_options: dict[str, Any] | None = None,
        population_locations: Mapping[str, str] | None = None,
    ) -> None:
        self.run = run if isinstance(run, RunDir) else RunDir(run, create=True, storage_options=storage_options)
        self.rank = _dist_rank() if rank is None else int(rank)
        if flush_rows < 1:
            raise InvalidInputError(f"flush_rows must be >= 1, found {flush_rows}")
        self.flush_rows = flush_rows
        self.epoch = int(epoch)
        self._depth = int(self.run.settings["shard_depth"])
        self._seq = time.time_ns()  # strictly increasing per rank, also across restarts
        self._keys: list[Sequence[str]] = []
        self._urls: list[Sequence[str]] = []
        self._losses: list[Any] = []
        self._rows = 0
        self._shard_of_url: dict[str, str] = {}
        self._shard_url: dict[str, tuple[str, str]] = {}  # shard name -> (location, first url)
        self._table_locations: ShardLocations | None = None  # of the loss table, read once per epoch
        self._population = dict(population_locations or {})
        self.stats = {"records": 0, "nonfinite": 0, "parts": 0}
        self.closed = False
        ref = weakref.ref(self)
        self._atexit = lambda: (lambda r: r.close() if r is not None else None)(ref())
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ API
    def set_epoch(self, epoch: int) -> None:
        """Start recording for ``epoch``; rows buffered for the previous epoch are flushed."""
        if int(epoch) != self.epoch:
            self.flush()
            self.epoch = int(epoch)
            self._table_locations = None  # the table may have grown since

    def record(self, keys: Sequence[str], urls: Sequence[str], loss: Any) -> None:
        """Buffer one batch: its ``__key__`` and ``__url__`` lists and per-sample loss.

        ``loss`` is the unweighted per-sample loss (``reduction='none'``): a torch tensor (any
        float dtype, any device) or numpy array of shape (batch,) or (batch, 1). Nothing is
        copied or synchronised here; the values are read at :meth:`flush`, so do not modify
        the tensor in place afterwards (record ``loss.clone()`` if the loop does).
        """
        if self.closed:
            raise InvalidInputError("record() after close(); create a new LossRecorder")
        n, kind = _loss_length(loss)
        if len(keys) != n or len(urls) != n:
            raise InvalidInputError(
                f"batch has {len(keys)} keys, {len(urls)} urls and {n} losses; expected one "
                "__key__, one __url__ and one loss per sample"
            )
        if n == 0:
            return
        if not (all(type(k) is str for k in keys) and all(type(u) is str for u in urls)):
            bad_key = next((k for k in keys if not isinstance(k, str)), keys[0])
            bad_url = next((u for u in urls if not isinstance(u, str)), urls[0])
            raise InvalidInputError(
                f"keys and urls must be strings, found {type(bad_key).__name__} and {type(bad_url).__name__}; "
                "pass batch['__key__'] and batch['__url__'] as collated by the DataLoader (lists of str)"
            )
        cache = self._shard_of_url
        for u in set(urls):  # a batch holds a few distinct urls
            if u not in cache:
                self._new_url(u)
        if kind == "torch":
            loss = loss.detach().reshape(-1)
        else:
            loss = np.asarray(loss).reshape(-1)
        self._keys.append(keys)
        self._urls.append(urls)
        self._losses.append(loss)
        self._rows += n
        if self._rows >= self.flush_rows:
            self.flush()

    def flush(self) -> str | None:
        """Write the buffer as one part; returns its relative path (None if the buffer is empty)."""
        if self._rows == 0:
            return None
        n = self._rows
        loss = self._to_numpy(self._losses)
        nonfinite = ~np.isfinite(loss)
        n_bad = int(nonfinite.sum())
        if n_bad:
            loss[nonfinite] = np.nan
        key_arr = pa.array([k for batch in self._keys for k in batch], type=pa.string())
        url_enc = pa.array([u for batch in self._urls for u in batch], type=pa.string()).dictionary_encode()
        shard_names = pa.array([self._shard_of_url[u] for u in url_enc.dictionary.to_pylist()], pa.string())
        shard_arr = pa.DictionaryArray.from_arrays(url_enc.indices, shard_names)
        locations = {s: self._shard_url[s][0] for s in set(shard_names.to_pylist())}
        table = make_part(
            shard_arr, key_arr, loss, epoch=self.epoch, rank=self.rank, seq0=self._seq, locations=locations
        )
        rel = write_part(self.run, self.rank, self.epoch, table)
        self._seq += n
        self.stats["records"] += n
        self.stats["nonfinite"] += n_bad
        self.stats["parts"] += 1
        self._clear()
        return rel

    def close(self) -> None:
        """Flush and stop; further record() calls raise."""
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            atexit.unregister(self._atexit)

    def __del__(self) -> None:
        # a recorder dropped without close() (e.g. a local variable) still lands its buffer
        if not getattr(self, "closed", True) and self.__dict__.get("_rows", 0):
            self.close()

    def __enter__(self) -> LossRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def _clear(self) -> None:
        self._keys, self._urls, self._losses, self._rows = [], [], [], 0

    @staticmethod
    def _to_numpy(losses: list[Any]) -> np.ndarray:
        is_torch = [type(x).__module__.split(".", 1)[0] == "torch" for x in losses]
        if all(is_torch) and len({x.device for x in losses}) == 1:
            import torch

            # one device->host copy per flush, in float32 (fp16/bf16 upcast exactly)
            return torch.cat([x.float() for x in losses]).cpu().numpy().astype(np.float32, copy=True)
        return np.concatenate(
            [x.float().cpu().numpy() if t else np.asarray(x, dtype=np.float32) for x, t in zip(losses, is_torch)]
        ).astype(np.float32, copy=False)

    def _new_url(self, url: str) -> None:
        """Name the shard of a url seen for the first time; two locations may not share a name
        (urls of one location may differ, e.g. signed URLs with different signatures)."""
        shard = shard_name(url, self._depth)
        location = shard_location(url)
        listed = self._population.get(shard)
        if listed is not None and listed != location:
            raise PopulationLocationError(
                f"shard {shard!r}: the population lists it at {listed!r}, but training reads it from {url!r}; "
                "the population and the training URLs name different locations, so the plans (made for the "
                "population's shards) and the losses (recorded for the training URLs' shards) would not be about "
                "the same shards, and nothing of this batch was recorded. List the population from the same URLs "
                "you train from: Pruner(..., population=seta_stream.list_samples(<the URLs the training pipeline "
                "reads>))"
            )
        other = self._shard_url.get(shard)
        if other is not None and other[0] != location:
            raise ShardNameConflictError(
                f"two shards have the same name {shard!r}: {other[1]!r} and {url!r}; sample identity is "
                f"(shard name, __key__) with shard_depth={self._depth}, so their samples would be mixed up. "
                f"{depth_hint(other[0], location)}"
            )
        if self._table_locations is None:  # another rank, or an earlier epoch, recorded into the table
            self._table_locations = ShardLocations(
                table_locations(self.run),
                f"the loss table ({self.run.display(MANIFEST)})",
                f"sample identity is (shard name, __key__) with shard_depth={self._depth}, so their samples would "
                "be mixed up",
            )
        self._table_locations.check(shard, location, f"the batch recorded now, url {url!r}")
        self._shard_url.setdefault(shard, (location, url))
        self._shard_of_url[url] = shard

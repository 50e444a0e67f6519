"""Routing loss records to the buckets of a partitioned table: compaction's scratch files.

Compaction of a partitioned run (format version 2) must not read every loss part once per
bucket, nor hold every record in memory. So it reads each pending part once and appends its
rows, grouped by bucket, to scratch files; folding bucket b then reads only b's rows. This
module owns those scratch files (their format is private to one compaction):

* a folder in the system's temporary directory (``TMPDIR``), ``seta-stream-route-*``, removed
  when the compaction ends (a killed compaction leaves it there; nothing reads it again);
* Arrow IPC files of about :data:`FILE_ROWS` records each, LZ4-compressed buffers, one record
  batch per bucket that has rows in it, columns ``part`` (index of the part in fold order), ``shard`` (int32 code
  into the compaction's list of shard names), ``key``, ``uid``, ``loss``, ``epoch``, ``rank``,
  ``seq``. Rows keep fold order within a bucket (parts in order, rows in part order).

Reading bucket b maps the files and decompresses b's batches: per-bucket memory is that
bucket's records, and the bytes read per compaction are the parts once plus the scratch once
(docs/benchmarks.md, "Web scale").

Why LZ4: uncompressed, ST+MJ-shaped records take 63 bytes each on disk (the ``part``, ``epoch``
and ``rank`` columns repeat one value per part; keys share long prefixes); LZ4 makes it 26 and
writes faster than the uncompressed file (0.62 s against 1.04 s for 7.7M records), zstd 17 at
0.89 s. At 200M samples the scratch is the largest thing compaction writes (12.6 GB
uncompressed), more than the page cache of a 24 GB machine keeps beside the table and parts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa

from .._kernels.arrays import group_order
from ..ids import shard_bucket

__all__ = ["FILE_ROWS", "RoutedRecords"]

#: Records per scratch file: the records buffered in memory before they are written.
FILE_ROWS = 1 << 21
_COLUMNS = ("key", "uid", "loss", "epoch", "rank", "seq")
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


class RoutedRecords:
    """The pending parts' records, routed to ``buckets`` buckets by shard name.

    :meth:`add` part after part in fold order, :meth:`close`, then :meth:`bucket` for each
    bucket; :meth:`remove` deletes the scratch folder."""

    def __init__(self, buckets: int, *, file_rows: int | None = None, folder: str | None = None) -> None:
        self.buckets = int(buckets)
        self.file_rows = int(file_rows or FILE_ROWS)
        if folder is None:
            folder = tempfile.mkdtemp(prefix="seta-stream-route-")
        else:  # a folder every process of a Ray engine reaches
            os.makedirs(folder)
        self.folder = folder
        self.names: list[str] = []  # shard names; the spill's shard column holds codes into it
        self._code_of: dict[str, int] = {}
        self._bucket_of_code: list[int] = []  # bucket of each name
        self._pending: list[list[pa.Table]] = [[] for _ in range(self.buckets)]
        self._pending_rows = 0
        self._files: list[tuple[str, dict[int, int]]] = []  # (path, {bucket: batch index})
        self._dictionary: pa.Array | None = None

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __getstate__(self) -> dict[str, Any]:
        """Once closed, the files' index travels (to a Ray task) without the buffers."""
        assert self._dictionary is not None, "close() first"
        return {**self.__dict__, "_pending": [[] for _ in range(self.buckets)]}

    # ---------------------------------------------------------------- writing
    def _codes(self, shard: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """int32 codes into :attr:`names` of a dictionary-encoded shard column, and each row's
        bucket, both looked up through each chunk's dictionary (work per part grows with the
        part's shards, not with every shard named so far)."""
        codes, buckets = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
        for chunk in shard.chunks:
            if not len(chunk):
                continue
            lut = np.array([self._code(s) for s in chunk.dictionary.to_pylist()], np.int32)
            bucket_lut = np.array([self._bucket_of_code[c] for c in lut.tolist()], np.int32)
            indices = chunk.indices.to_numpy(zero_copy_only=False)
            codes.append(lut[indices])
            buckets.append(bucket_lut[indices])
        return np.concatenate(codes), np.concatenate(buckets)

    def _code(self, name: str) -> int:
        code = self._code_of.get(name)
        if code is None:
            code = self._code_of[name] = len(self.names)
            self.names.append(name)
            self._bucket_of_code.append(shard_bucket(name, self.buckets))
        return code

    def add(self, k: int, part: pa.Table) -> None:
        """Route the rows of part ``k`` (PART_SCHEMA columns, shard dictionary-encoded)."""
        codes, bucket = self._codes(part.column("shard"))
        order = group_order(bucket, self.buckets)
        bounds = np.searchsorted(bucket[order], np.arange(self.buckets + 1))
        routed = pa.table(
            {
                "part": pa.array(np.full(len(codes), k, np.int32)),
                "shard": pa.array(codes),
                **{c: part.column(c) for c in _COLUMNS},
            }
        ).take(pa.array(order))
        for b in np.flatnonzero(np.diff(bounds)).tolist():
            self._pending[b].append(routed.slice(int(bounds[b]), int(bounds[b + 1] - bounds[b])))
        self._pending_rows += len(codes)
        if self._pending_rows >= self.file_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._pending_rows:
            return
        path = os.path.join(self.folder, f"route-{len(self._files):06d}.arrow")
        index: dict[int, int] = {}
        schema = None
        with pa.OSFile(path, "wb") as sink:
            writer = None
            for b, pieces in enumerate(self._pending):
                if not pieces:
                    continue
                batch = pa.concat_tables(pieces).combine_chunks().to_batches()[0]
                if writer is None:
                    schema = batch.schema
                    writer = pa.ipc.new_file(sink, schema, options=_WRITE_OPTIONS)
                index[b] = len(index)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
        self._files.append((path, index))
        self._pending = [[] for _ in range(self.buckets)]
        self._pending_rows = 0

    def close(self) -> None:
        """Write what is buffered (call once, after the last :meth:`add`)."""
        self._flush()
        self._dictionary = pa.array(self.names, pa.string())

    # ---------------------------------------------------------------- reading
    def _batches(self, b: int) -> list[pa.RecordBatch]:
        out = []
        for path, index in self._files:
            if b in index:
                out.append(pa.ipc.open_file(pa.memory_map(path, "r")).get_batch(index[b]))
        return out

    def bucket_uids(self, b: int) -> np.ndarray:
        """The uids of bucket ``b``'s records (all of them, in fold order)."""
        batches = self._batches(b)
        if not batches:
            return np.zeros(0, np.uint64)
        return np.concatenate([batch.column("uid").to_numpy() for batch in batches])

    def bucket(self, b: int) -> list[tuple[int, pa.Table]]:
        """(part index, that part's records in bucket ``b``) in fold order; each table has the
        part columns, ``shard`` dictionary-encoded with exactly the names of its rows' shards.

        Not with all the compaction's shard names: the fold looks each piece's dictionary up
        name by name, so that would cost pieces x shards, which grows as N^2 (at 100M samples,
        1,152 pieces of 20,000 names: 23M lookups, 6.5 s of a 60 s compaction). Finding a
        piece's own names costs its rows plus its bucket's shards, and once per bucket a byte
        per shard name of the compaction (the mask of the names the bucket holds)."""
        assert self._dictionary is not None, "close() first"
        batches = self._batches(b)
        if not batches:
            return []
        table = pa.Table.from_batches(batches).combine_chunks()
        part = table.column("part").to_numpy()
        cuts = np.concatenate([[0], np.flatnonzero(part[1:] != part[:-1]) + 1, [len(part)]])
        codes = table.column("shard").chunk(0).to_numpy()
        present = np.zeros(len(self.names), bool)
        present[codes] = True
        in_bucket = np.flatnonzero(present)  # codes of this bucket's shards, ascending
        local = np.searchsorted(in_bucket, codes).astype(np.int32)
        out = []
        for a, z in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            piece = local[a:z]
            used = np.zeros(len(in_bucket), bool)
            used[piece] = True
            names = np.flatnonzero(used)
            renumber = np.zeros(len(in_bucket), np.int32)
            renumber[names] = np.arange(len(names), dtype=np.int32)
            shard = pa.DictionaryArray.from_arrays(
                pa.array(renumber[piece]), self._dictionary.take(pa.array(in_bucket[names]))
            )
            columns = {c: table.column(c).slice(a, z - a) for c in _COLUMNS}
            out.append((int(part[a]), pa.table({"shard": shard, **columns})))
        return out

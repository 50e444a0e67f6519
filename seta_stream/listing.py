"""List the samples of tar shards from their headers (a population listing for planning).

``list_samples(urls)`` returns every (shard, key) of the shards without reading member data:
the tar headers are read and the data blocks skipped, so a shard of any size is listed in the
time it takes to read its headers. Keys are derived exactly as webdataset derives ``__key__``
(``webdataset.tariterators.base_plus_ext``). Passing the listing to ``plan_epoch`` /
``Pruner(population=...)`` makes plans cover every sample from epoch 0 on: pruned fractions
are exact, and shards with no kept sample can be skipped without opening them.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable

import fsspec
import pyarrow as pa
from webdataset.tariterators import base_plus_ext

from .ids import shard_name

__all__ = ["list_samples"]


def list_samples(urls: Iterable[str], *, shard_depth: int = 1) -> pa.Table:
    """Table (shard, key) of every sample in the given shards (local paths or fsspec URLs)."""
    shards: list[str] = []
    keys: list[str] = []
    for url in urls:
        name = shard_name(url, shard_depth)
        seen: set[str] = set()
        with fsspec.open(url, "rb", compression="infer") as fh:
            # fsspec already decompresses .gz; "r|*" also reads a stream it left compressed
            tar_cm = tarfile.open(fileobj=fh, mode="r|*") if url.endswith((".gz", ".tgz")) else tarfile.open(fileobj=fh)
            with tar_cm as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    prefix, _ = base_plus_ext(member.name)
                    if prefix is None or prefix in seen:
                        continue
                    seen.add(prefix)
                    shards.append(name)
                    keys.append(prefix)
    return pa.table({"shard": pa.array(shards, pa.string()), "key": pa.array(keys, pa.string())})

"""List the samples of tar shards from their headers (a population listing for planning).

``list_samples(urls)`` returns every (shard, key) of the shards without reading member data:
the tar headers are read and the data blocks skipped, so a shard of any size is listed in the
time it takes to read its headers. Keys are derived exactly as webdataset derives ``__key__``
(``webdataset.tariterators.base_plus_ext``). Passing the listing to ``plan_epoch`` /
``Pruner(population=...)`` makes plans cover every sample from epoch 0 on: pruned fractions
are exact, and shards with no kept sample can be skipped without opening them.

``urls`` is anything ``wds.WebDataset`` takes as its shard list: a list of URLs, or one string
with brace ranges (``"/d/shard-{000..009}.tar"``) and ``::`` separators, expanded by
webdataset's own ``expand_urls``. ``pipe:`` URLs run their command through webdataset's
``gopen`` (what the training pipeline runs); other URLs are opened with fsspec.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Sequence
from typing import Any

import fsspec
import pyarrow as pa
from webdataset.shardlists import expand_urls
from webdataset.tariterators import base_plus_ext

from ..errors import ShardNameConflictError
from ..ids import depth_hint, shard_location, shard_name

__all__ = ["list_samples"]

_COMPRESSED = (".gz", ".tgz", ".bz2", ".xz")


def list_samples(urls: str | Iterable[str], *, shard_depth: int = 1, members: Sequence[str] | None = None) -> pa.Table:
    """Table (shard, key, url) of every sample in the given shards.

    ``url`` is the shard's URL as given (what webdataset puts in ``__url__``). Raises
    :class:`~seta_stream.errors.ShardNameConflictError` before reading anything when two
    different shards (``train/shard-000.tar`` and ``val/shard-000.tar``) would get the same
    shard name at ``shard_depth``, and :class:`~seta_stream.errors.ShardNameError` for a
    ``pipe:`` URL whose shard cannot be told from its command.

    ``members``: the members a sample needs, so that samples the training pipeline drops for
    lack of one are left out of the listing (and of the plans it seeds): each entry is an
    extension as webdataset names a sample's fields (lower case, ``"txt"``), or alternatives
    separated by ``;`` as in ``to_tuple``/``rename`` (``"jpg;png;jpeg;webp"``: any one of them).
    ``seta_stream.openclip.MEMBERS`` is what OpenCLIP's ``filter_no_caption_or_no_image`` keeps.
    """
    url_list = expand_urls(urls) if isinstance(urls, str) else [u for spec in urls for u in expand_urls(spec)]
    names = _names(url_list, shard_depth)
    if isinstance(members, str):  # one member, not its characters
        members = [members]
    needs = None if members is None else [frozenset(m.lower().split(";")) for m in members]
    shards: list[str] = []
    keys: list[str] = []
    url_of_row: list[str] = []
    for url, name in zip(url_list, names):
        found: dict[str, set[str]] = {}  # key -> its members' extensions, keys in file order
        for prefix, suffix in _member_names(url):
            found.setdefault(prefix, set()).add(suffix.lower())
        for prefix, suffixes in found.items():
            if needs is not None and not all(need & suffixes for need in needs):
                continue
            shards.append(name)
            keys.append(prefix)
            url_of_row.append(url)
    return pa.table(
        {
            "shard": pa.array(shards, pa.string()),
            "key": pa.array(keys, pa.string()),
            "url": pa.array(url_of_row, pa.string()).dictionary_encode(),
        }
    )


def _names(urls: list[str], depth: int) -> list[str]:
    """Shard name of every url; two locations with one name stop the listing."""
    first: dict[str, tuple[str, str]] = {}
    names = []
    for url in urls:
        name, location = shard_name(url, depth), shard_location(url)
        other = first.setdefault(name, (location, url))
        if other[0] != location:
            raise ShardNameConflictError(
                f"two shards have the same name {name!r} at shard_depth={depth}: {other[1]!r} and {url!r}; "
                f"sample identity is (shard name, __key__), so their samples would be merged. "
                f"{depth_hint(other[0], location)}"
            )
        names.append(name)
    return names


def _member_names(url: str) -> Iterable[tuple[str, str]]:
    """webdataset's (key, extension) of every file member, in file order (headers only where seekable)."""
    with _open(url) as fh:
        compressed = shard_location(url).endswith(_COMPRESSED)
        # a pipe is not seekable, and a compressed stream is read as one
        mode = "r|*" if compressed or url.startswith("pipe:") else "r:"
        with tarfile.open(fileobj=fh, mode=mode) as tar:
            for member in tar:
                if member.isfile():
                    prefix, suffix = base_plus_ext(member.name)
                    if prefix is not None:
                        yield prefix, suffix


def _open(url: str) -> Any:
    if url.startswith("pipe:"):
        from webdataset.gopen import gopen

        return gopen(url, "rb")
    compression = fsspec.utils.infer_compression(shard_location(url))  # not fooled by a query string
    return fsspec.open(url, "rb", compression=compression).open()

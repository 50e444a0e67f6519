"""What differs between the webdataset releases seta_stream supports (0.2.86 to 1.x).

* ``group_by_keys``: webdataset's grouper, with an empty dict ``{}`` in the member stream ending
  the current sample on every release. webdataset 1.x does that itself (its tar reader marks
  each shard's end with ``{}``); 0.2.x's grouper reads ``{}`` as a member and fails with
  ``KeyError: 'fname'``, so there each run of members between two markers is grouped on its
  own. The readers use the marker to keep two samples apart (a shard's end, a key that comes
  back after a dropped sample), so they yield the same samples on every release. (webdataset
  0.2.x's own ``tarfile_to_samples`` has no marker: a shard whose first key equals the
  previous shard's last key continues that sample, which 1.x fixed.)
* ``WEBDATASET_MARKS_SHARD_ENDS``: whether the installed grouper understands the marker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from webdataset.handlers import reraise_exception
from webdataset.tariterators import group_by_keys as _wds_group_by_keys

__all__ = ["group_by_keys", "WEBDATASET_MARKS_SHARD_ENDS"]


def _marks_shard_ends() -> bool:
    members = [{"fname": "a.x", "data": b"", "__url__": "u"}, {}, {"fname": "a.y", "data": b"", "__url__": "u"}]
    try:
        return len(list(_wds_group_by_keys(iter(members)))) == 2
    except KeyError:  # 0.2.x: the marker is read as a member
        return False


WEBDATASET_MARKS_SHARD_ENDS = _marks_shard_ends()


def group_by_keys(
    data: Iterable[dict[str, Any]], handler: Callable[[Exception], bool] = reraise_exception
) -> Iterator[dict[str, Any]]:
    """webdataset's ``group_by_keys(data, handler=handler)``; ``{}`` ends the current sample."""
    if WEBDATASET_MARKS_SHARD_ENDS:
        yield from _wds_group_by_keys(data, handler=handler)
        return
    members = iter(data)
    ended = False

    def segment() -> Generator[dict[str, Any], None, None]:
        nonlocal ended
        for member in members:
            if not member:
                return
            yield member
        ended = True

    while not ended:
        run = segment()
        yield from _wds_group_by_keys(run, handler=handler)
        # the grouper stopped early (its handler said stop): so does 1.x's
        if inspect.getgeneratorstate(run) != inspect.GEN_CLOSED:
            return

"""A shard URL parsed once: :class:`Shard`.

A shard enters the reading side as webdataset's URL string (``{"url": ...}``, ``__url__``): a
path, an fsspec URL (a signed one with its query string), or a ``pipe:`` command. What the
readers and the shard indexes need of it (where it reads from, its name in the run, what fsspec
opens to read its bytes, whether it carries a query string) is derived here, from one parse of
the URL (:func:`seta_stream.ids.shard_location`), and each derived value is computed once, when
first asked. ``read_kept`` builds one :class:`Shard` per shard and passes it down; the public
functions of ``seta_stream.index`` build one from the URL they are given.

This module does no I/O.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property

from ..errors import ShardNameError
from ..ids import shard_location, shard_name

__all__ = ["Shard"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class Shard:
    """A shard URL (``url``, as given), the location it reads its shard from (``location``:
    :func:`~seta_stream.ids.shard_location`, no query string, no ``file://``, the URL or path
    inside a ``pipe:`` command), and ``depth``, the run's ``shard_depth`` its ``name`` is taken at.

    Build it with :meth:`of` (which parses the location); the other values are computed from
    ``url`` and ``location`` when first asked."""

    url: str
    location: str
    depth: int = 1

    @classmethod
    def of(cls, url: str | Shard, depth: int = 1) -> Shard:
        """The shard ``url`` reads (a :class:`Shard` at ``depth`` is returned as it is).

        Raises what :func:`~seta_stream.ids.shard_location` raises for a URL that names no shard."""
        if isinstance(url, Shard) and url.depth == depth:
            return url
        text = url.url if isinstance(url, Shard) else url
        return cls(text, shard_location(text), depth)

    @property
    def is_pipe(self) -> bool:
        return self.url.startswith("pipe:")

    @cached_property
    def name(self) -> str:
        """The shard's name in the run: :func:`~seta_stream.ids.shard_name` at ``depth``."""
        try:
            # the location is its own location: naming it does not parse the URL again
            return shard_name(self.location, self.depth)
        except ShardNameError:
            return shard_name(self.url, self.depth)  # raises, naming the URL as given

    @cached_property
    def has_query(self) -> bool:
        """True if the URL carries a query string or fragment (a signed URL), also inside a ``pipe:`` command."""
        if self.is_pipe:
            return re.search(re.escape(self.location) + r"[?#]", self.url) is not None
        text = self.url[len("file://") :] if self.url.startswith("file://") else self.url
        return text != self.location

    @cached_property
    def byte_source(self) -> str | None:
        """What fsspec opens to read the shard's bytes: the URL itself (query string kept), or
        for a ``pipe:`` command the URL or path it reads, as written in the command (query
        string kept). None if that cannot be found verbatim in the command (shell escapes):
        only running the command can read it."""
        if not self.is_pipe:
            return self.url
        match = re.search(re.escape(self.location) + r"(\?[^\s'\"#]*)?", self.url)
        return None if match is None else match.group(0)

    @cached_property
    def canonical(self) -> str:
        """The location as shard indexes record it: local paths made absolute."""
        loc = self.location
        if not _SCHEME.match(loc):
            loc = os.path.abspath(loc)
        return loc

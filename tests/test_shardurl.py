"""The reading side's parsed shard URL (seta_stream/_reading/shardurl.py): a Shard built once
from a URL says what every function of a URL said of it (shard_location, shard_name at each
depth, has_query, byte_source, canonical_location), on every shard spec idiom, and fails as
they fail."""

from __future__ import annotations

import pytest

from seta_stream._reading.shardindex import byte_source, canonical_location, has_query
from seta_stream._reading.shardurl import Shard
from seta_stream.errors import InvalidInputError, ShardNameError
from seta_stream.ids import shard_location, shard_name
from tests.test_ids import SPECS

MORE = [
    "pipe:cat '/d/s-1.tar' | cat",
    "pipe:curl -s https://h/d/s.tar?sig=1 || true",
    "pipe:cat /d/a\\ b.tar",  # a shell escape: only the command can read it (byte_source None)
    "relative/dir/s-2.tar",
    "file:///d/s-3.tar#frag",
    "/d/odd?name.tar",
]


@pytest.mark.parametrize("url", [u for u, _, _ in SPECS] + MORE)
def test_a_shard_says_what_the_functions_of_its_url_say(url: str) -> None:
    for depth in (1, 2):
        shard = Shard.of(url, depth)
        assert (shard.url, shard.location, shard.depth) == (url, shard_location(url), depth)
        assert shard.name == shard_name(url, depth)
        assert shard.has_query == has_query(url)
        assert shard.byte_source == byte_source(url)
        assert shard.canonical == canonical_location(url)
        assert Shard.of(shard, depth) is shard  # passed down, not parsed again
        assert Shard.of(shard, depth + 1).name == shard_name(url, depth + 1)


def test_a_url_that_names_no_shard_fails_as_the_functions_fail() -> None:
    for url in ("", None, "pipe:echo hi", "pipe:cat /d/a.tar /d/b.tar"):
        with pytest.raises((InvalidInputError, ShardNameError)) as expected:
            shard_name(url)  # type: ignore[arg-type]
        with pytest.raises(type(expected.value)) as got:
            _ = Shard.of(url).name  # type: ignore[arg-type]
        assert str(got.value) == str(expected.value)
    with pytest.raises(ShardNameError) as expected:
        shard_name("/")
    with pytest.raises(ShardNameError) as got:
        _ = Shard.of("/").name
    assert str(got.value) == str(expected.value)

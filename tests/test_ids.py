"""Sample identity: shard names, uids (vectorised == scalar), collision checks."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seta_stream import ids
from seta_stream.errors import InvalidInputError, SampleIdCollisionError
from seta_stream.ids import (
    check_identity_collisions,
    mix64,
    mix64_array,
    sample_uid,
    sample_uids,
    shard_name,
)


@pytest.mark.parametrize(
    ("url", "depth", "expected"),
    [
        ("/data/train/shard-000001.tar", 1, "shard-000001.tar"),
        ("s3://bucket/a/b/shard-7.tar.gz", 1, "shard-7.tar.gz"),
        ("s3://bucket/a/b/shard-7.tar.gz", 2, "b/shard-7.tar.gz"),
        ("pipe:curl -s -L https://host/x/y-003.tar", 1, "y-003.tar"),
        ("https://host/x/y-003.tar?versionId=4", 1, "y-003.tar"),
        ("shard.tar", 3, "shard.tar"),
    ],
)
def test_shard_name(url, depth, expected):
    assert shard_name(url, depth) == expected


def test_shard_name_rejects_bad_input():
    with pytest.raises(InvalidInputError, match="__url__ must be a non-empty string"):
        shard_name("")
    with pytest.raises(InvalidInputError, match="shard_depth must be >= 1, found 0"):
        shard_name("a.tar", 0)


def test_mix64_matches_splitmix64_reference_values():
    # SplitMix64 outputs for state 0: the finalizer of 0x9E3779B97F4A7C15.
    assert mix64(0) == 0xE220A8397B1DCDAF
    x = np.array([0, 1, 2**64 - 1], dtype=np.uint64)
    assert mix64_array(x).tolist() == [mix64(0), mix64(1), mix64(2**64 - 1)]


def test_mix64_array_over_several_blocks_in_place_and_not():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2**64, 2 * ids._MIX_BLOCK + 999, dtype=np.uint64)  # two whole blocks and a tail
    picks = [0, ids._MIX_BLOCK - 1, ids._MIX_BLOCK, 2 * ids._MIX_BLOCK, len(x) - 1]
    want = [mix64(int(x[i])) for i in picks]
    got = mix64_array(x)
    assert got is not x and got[picks].tolist() == want
    y = x.copy()
    assert mix64_array(y, out=y) is y and np.array_equal(y, got)
    square = x[: 2 * 500].reshape(2, 500)
    assert mix64_array(square).ravel().tolist() == [mix64(int(v)) for v in square.ravel()]


def test_uid_depends_on_shard_and_key_and_is_fixed():
    a = sample_uid("train-000000.tar", "train_000001")
    assert a == sample_uid("train-000000.tar", "train_000001")
    assert a != sample_uid("train-000001.tar", "train_000001")
    assert a != sample_uid("train-000000.tar", "train_000002")
    # boundary between shard and key is unambiguous
    assert sample_uid("ab", "c") != sample_uid("a", "bc")
    # trailing NUL bytes change the uid (length is folded in)
    assert sample_uid("s", "abcdefgh") != sample_uid("s", "abcdefgh\x00")


text = st.text(min_size=0, max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(text, text), min_size=1, max_size=30))
def test_vectorised_uids_equal_scalar(pairs):
    shards = [p[0] for p in pairs]
    keys = [p[1] for p in pairs]
    vec = sample_uids(shards, keys)
    assert vec.dtype == np.uint64
    assert vec.tolist() == [sample_uid(s, k) for s, k in pairs]


def test_vectorised_uids_accept_arrow_chunked_and_dictionary():
    shards = pa.chunked_array([["a.tar", "b.tar"], ["a.tar"]]).cast(pa.string())
    keys = pa.chunked_array([["k/1", "ключ"], ["x y.z"]])
    expected = [sample_uid("a.tar", "k/1"), sample_uid("b.tar", "ключ"), sample_uid("a.tar", "x y.z")]
    assert sample_uids(shards, keys).tolist() == expected
    enc = pa.array(["a.tar", "b.tar", "a.tar"]).dictionary_encode()
    assert sample_uids(enc, pa.array(["k/1", "ключ", "x y.z"]).cast(pa.large_string())).tolist() == expected


def test_uids_length_mismatch():
    with pytest.raises(InvalidInputError, match="2 shard names but 1 keys"):
        sample_uids(["a", "b"], ["k"])


def test_collision_check_passes_repeats_and_rejects_collisions():
    uids = np.array([5, 7, 5], dtype=np.uint64)
    check_identity_collisions(uids, ["a", "b", "a"], ["k", "k", "k"])  # same identity twice
    with pytest.raises(SampleIdCollisionError, match=r"\('a', 'k'\) and \('c', 'k'\) both hash"):
        check_identity_collisions(uids, ["a", "b", "c"], ["k", "k", "k"])


# Every shard spec idiom of the webdataset and OpenCLIP docs: (url, shard_location, shard_name).
SPECS = [
    ("/data/train/shard-000.tar", "/data/train/shard-000.tar", "shard-000.tar"),
    ("file:///data/train/shard-001.tar", "/data/train/shard-001.tar", "shard-001.tar"),
    ("pipe:cat /data/train/shard-002.tar", "/data/train/shard-002.tar", "shard-002.tar"),
    ("pipe:cat /data/train/shard-003.tar || true", "/data/train/shard-003.tar", "shard-003.tar"),
    ("pipe:curl -s -L https://h/data/shard-004.tar || true", "https://h/data/shard-004.tar", "shard-004.tar"),
    ("pipe:curl -s -L 'https://h/data/shard-005.tar?sig=a b' || true", "https://h/data/shard-005.tar", "shard-005.tar"),
    ("pipe:aws s3 cp s3://b/train/shard-006.tar -", "s3://b/train/shard-006.tar", "shard-006.tar"),
    ("pipe:gsutil cat gs://b/train/shard-007.tar", "gs://b/train/shard-007.tar", "shard-007.tar"),
    ("pipe:cat /data/train/shard-008.tar | cat", "/data/train/shard-008.tar", "shard-008.tar"),
    ("pipe:curl -s https://h/d/shard-009.tar | cat", "https://h/d/shard-009.tar", "shard-009.tar"),
    ("https://h/d/shard-010.tar?X-Amz-Signature=abc&X-Amz-Expires=60", "https://h/d/shard-010.tar", "shard-010.tar"),
    ("s3://b/train/shard-011.tar", "s3://b/train/shard-011.tar", "shard-011.tar"),
    ("/data/train/shard-{000..009}.tar", "/data/train/shard-{000..009}.tar", "shard-{000..009}.tar"),
]


@pytest.mark.parametrize(("url", "location", "name"), SPECS)
def test_every_shard_spec_idiom_is_named_by_the_shard_it_reads(url, location, name):
    from seta_stream.ids import shard_location

    assert shard_location(url) == location
    assert shard_name(url) == name


def test_different_shards_never_share_a_name_across_idioms():
    names = [shard_name(url) for url, _, _ in SPECS]
    assert len(set(names)) == len(names)
    # one shard reached through different idioms keeps one name
    same = ["/d/s-1.tar", "file:///d/s-1.tar", "pipe:cat /d/s-1.tar || true", "pipe:cat '/d/s-1.tar' | cat"]
    assert {shard_name(u, 2) for u in same} == {"d/s-1.tar"}


@pytest.mark.parametrize(
    ("url", "found"),
    [
        ("pipe:true", "no URL or tar file path"),
        ("pipe:curl -s -L || true", "no URL or tar file path"),
        ("pipe:cat /d/a.tar /d/b.tar", "2 candidates ['/d/a.tar', '/d/b.tar']"),
    ],
)
def test_pipe_commands_without_one_shard_stop_with_how_to_name_it(url, found):
    from seta_stream.errors import ShardNameError

    with pytest.raises(ShardNameError) as err:
        shard_name(url)
    assert str(err.value) == (
        f"cannot tell which shard the pipe: URL {url!r} reads: its command has {found}; expected exactly one "
        "URL (scheme://...) or *.tar path among the arguments of its first command, e.g. "
        "'pipe:curl -s -L https://host/data/shard-000.tar || true'. Put the shard's URL or path in the command "
        "as a plain argument (shard names come from it)"
    )

"""The index reader's header check done for many members at once (index.member_headers_match)
gives member_header_matches' answer for every header: real headers of tar writers (ustar, GNU,
pax; long, prefixed, non-ASCII names; sizes up to base-256), and the same headers damaged."""

from __future__ import annotations

import random
import tarfile

import numpy as np
import pytest

from seta_stream._reading.shardindex import member_header_matches, member_headers_match


def headers_of(fmt, names_sizes):
    """(header, name, size) of members as tarfile writes them in ``fmt``: the last 512 bytes of
    what it writes before a member's data (long-name and pax records come before it)."""
    out = []
    for name, size in names_sizes:
        info = tarfile.TarInfo(name)
        info.size = size
        out.append((info.tobuf(fmt, "utf-8", "surrogateescape")[-512:], name, size))
    return out


def with_checksum(header, rng):
    """``header`` with a valid checksum, written as one of the forms tar writers use."""
    h = bytearray(header)
    h[148:156] = b" " * 8
    total = sum(h)
    form = rng.choice([b"%06o\0 ", b"%07o\0", b" %06o\0", b"%o\0", b"%08o", b"  %o "])
    h[148:156] = (form % total).ljust(8, b"\0")[:8]
    return bytes(h)


NAMES = [
    ("a.jpg", 0),
    ("d1/sample0001.cls", 1),
    ("x" * 99 + ".t", 3),  # over 99 bytes: a long-name / pax record, not compared
    ("p" * 120 + "/q.txt", 5),  # fits ustar with a prefix
    ("é/ü.jpg", 7),
    ("n" * 98, 512),
    ("big.bin", 8**11 + 3),  # over the octal size field: base-256 (GNU) or a pax size record
]


def damaged(header, rng):
    h = bytearray(header)
    where = rng.choice([range(0, 100), range(124, 136), range(148, 156), [156], range(345, 360), range(512)])
    for _ in range(rng.choice([1, 1, 2, 5])):
        h[rng.choice(list(where))] = rng.choice(
            [0, 32, 48, 49, 55, 56, 57, 0x80, 0xFF, ord("a"), ord("\t"), rng.randrange(256)]
        )
    return bytes(h)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_many_headers_at_once_equal_one_by_one(fmt):
    names = [ns for ns in NAMES if fmt != tarfile.USTAR_FORMAT or (len(ns[0]) < 100 and ns[1] < 8**11)]
    real = headers_of(fmt, names)
    assert len(real) == len(names)
    rng = random.Random(fmt)
    cases = list(real)
    for _ in range(3000):
        header, name, size = rng.choice(real)
        if rng.random() < 0.2:  # the index names another member or another size
            cases.append((header, rng.choice(real)[1], size))
            cases.append((header, name, rng.choice([0, 1, size + 1, size + 512])))
        bad = damaged(header, rng)
        cases.append((bad, name, size))
        cases.append((with_checksum(bad, rng), name, size))  # damaged, then given a valid checksum
    expected = [member_header_matches(h, n, s) for h, n, s in cases]
    # the headers at odd positions of one buffer, as the reader reads them between member data
    gaps = [rng.randrange(0, 700) for _ in cases]
    buf, positions = bytearray(), []
    for (h, _, _), g in zip(cases, gaps):
        buf += bytes(g)
        positions.append(len(buf))
        buf += h
    got = member_headers_match(
        bytes(buf), np.array(positions), [n for _, n, _ in cases], np.array([s for *_, s in cases])
    )
    assert got.tolist() == expected
    assert all(expected[: len(real)]) and 0.2 < sum(expected) / len(expected) < 0.8  # real ones pass, damage fails


def test_headers_of_a_webdataset_shard_are_checked_at_once(tmp_path, monkeypatch):
    import webdataset as wds

    from seta_stream._reading import shardindex as index

    path = str(tmp_path / "s.tar")
    with wds.TarWriter(path) as w:
        for i in range(50):
            w.write({"__key__": f"d{i % 3}/k{i:04d}", "jpg": bytes(i * 37), "cls": str(i)})
    idx = index.build_index(path)
    members = [m for _, ms in idx["samples"] for m in ms]
    data = open(path, "rb").read()
    one_by_one = []
    monkeypatch.setattr(index, "member_header_matches", lambda *a: one_by_one.append(a) or False)
    positions = np.array([off - 512 for _, off, _ in members])
    sizes = np.array([size for *_, size in members])
    names = [name for name, _, _ in members]
    assert member_headers_match(data, positions, names, sizes).all() and one_by_one == []
    shifted = member_headers_match(data, positions[1:], names[:-1], sizes[:-1])  # every header another member's
    assert not shifted.any() and len(one_by_one) == len(members) - 1

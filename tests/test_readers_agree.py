"""The three readers of a plan agree sample for sample and count for count (tests/readers.py)."""

from __future__ import annotations

import pytest
import webdataset as wds
from conftest import write_shards
from readers import check_readers_agree

import seta_stream as seta
from seta_stream import RunDir, plan_epoch


def population(urls):
    return seta.list_samples(urls)


@pytest.mark.parametrize(
    ("policy", "params", "listed", "kept"),
    [
        ("full", {}, True, 90),
        ("random", {"r": 0.5}, True, 45),
        ("infobatch", {"r": 0.5}, True, None),  # empty table: every sample kept, weight 1
        ("seta", {"r": 0.4}, False, None),  # empty table, no population: absent rule u < 0.6
    ],
)
def test_readers_agree_on_every_kind_of_plan(tmp_path, policy, params, listed, kept):
    urls = write_shards(tmp_path / "shards", [30, 30, 30])
    run = tmp_path / "run"
    plan_epoch(
        RunDir(run, create=True),
        0,
        policy=policy,
        params=params,
        epochs=4,
        seed=5,
        population=population(urls) if listed else None,
    )
    samples, counts = check_readers_agree(urls, run)
    assert counts["kept"] + counts["dropped"] == 90 and counts["kept"] == len(samples)
    if kept is not None:
        assert len(samples) == kept
    if not listed:
        assert counts["absent_kept"] + counts["absent_dropped"] == 90 and 0 < counts["absent_kept"] < 90


def test_readers_agree_on_a_key_repeated_later_in_a_shard(tmp_path):
    """keys a, b, a: two samples 'a' (one identity, one decision), never merged."""
    path = tmp_path / "rep-0000.tar"
    with wds.TarWriter(str(path)) as w:
        for key, text in [("a", "first"), ("b", "middle"), ("a", "second"), ("c", "last")]:
            w.write({"__key__": key, "txt": text})
    urls = [str(path)]
    run = tmp_path / "run"
    pop = [("rep-0000.tar", k) for k in ("a", "b", "c")]
    drop_b = (seta.ids.sample_uid("rep-0000.tar", "b"),)
    from test_stage import DropParams  # noqa: F401  (registers the test_drop_listed policy)

    plan_epoch(
        RunDir(run, create=True), 0, policy="test_drop_listed", params={"drop": drop_b}, epochs=1, population=pop
    )
    samples, counts = check_readers_agree(urls, run)
    assert [(s["__key__"], s["txt"]) for s in samples] == [("a", b"first"), ("a", b"second"), ("c", b"last")]
    assert counts == {"kept": 3, "dropped": 1, "absent_kept": 0, "absent_dropped": 0}

"""layout: every run-relative path, and the epoch and rank parsed back out of them."""

import pytest

from seta_stream._store import layout


def test_paths_are_spelled_as_docs_format_says():
    assert layout.part_path(3, 12, 42, "ab12cd34") == (
        "losses/rank=3/epoch=12/part-R00003-E000012-00000000000000000042-ab12cd34.parquet"
    )
    assert layout.table_file(7, "9f2c1a7b") == "table/table-000007-9f2c1a7b.parquet"
    assert layout.keys_file(7, "9f2c1a7b") == "table/keys-000007-9f2c1a7b.arrow"
    assert layout.plan_dir(4) == "plans/epoch=4"
    assert layout.plan_file(4, "summary.json") == "plans/epoch=4/summary.json"
    assert layout.stats_file(2, 1) == "stats/epoch=2/rank=1.json"
    assert layout.stats_glob(2) == "stats/epoch=2/rank=*.json"
    assert layout.lock_file("compact") == "locks/compact.lock"
    assert (layout.STATE, layout.MANIFEST, layout.FORMAT_FILE) == (
        "state.json",
        "table/manifest.json",
        "seta-stream.json",
    )


def test_epoch_and_rank_are_parsed_from_any_path_holding_them():
    part = layout.part_path(3, 12, 42, "ab12cd34")
    assert (layout.epoch_of(part), layout.rank_of(part)) == (12, 3)
    assert layout.epoch_of(layout.plan_file(40, "summary.json")) == 40
    assert layout.epoch_of("stats/epoch=5/rank=0.json") == 5
    with pytest.raises(ValueError, match=r"'table/manifest.json' has no epoch=E component"):
        layout.epoch_of("table/manifest.json")
    with pytest.raises(ValueError, match=r"has no rank=R component"):
        layout.rank_of("plans/epoch=1/summary.json")


def test_moved_parts_keep_their_rank_and_epoch_folders():
    part = layout.part_path(1, 0, 5, "t")
    assert layout.moved_part(part, layout.QUARANTINE) == "losses-quarantine/" + part[len("losses/") :]
    assert layout.moved_part(part, layout.SUPERSEDED).startswith("losses-superseded/rank=1/epoch=0/")
    with pytest.raises(ValueError, match="is not a loss part path"):
        layout.moved_part("table/x.parquet", layout.QUARANTINE)

"""tools/text_to_shards.py: table of texts -> WebDataset shards that webdataset and the stage read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import webdataset as wds

from tools import text_to_shards as t2s

ROOT = Path(__file__).resolve().parent.parent
SST2 = ROOT.parent / "shared" / "data" / "sst2"


def _read(out: Path, prefix: str) -> list[tuple[str, str, int]]:
    urls = sorted(str(p) for p in out.glob(f"{prefix}-*.tar"))
    return [(s["__key__"], s["txt"], s["cls"]) for s in wds.WebDataset(urls, shardshuffle=False).decode()]


def test_tsv_round_trip_keys_order_and_shards(tmp_path: Path) -> None:
    src = tmp_path / "t.tsv"
    rows = ['a film with "quotes" , commas', "ünïcode words", "x", "the end ", "five"]
    src.write_text("sentence\tlabel\n" + "".join(f"{r}\t{i % 2}\n" for i, r in enumerate(rows)), encoding="utf-8")
    summary = t2s.convert(src, tmp_path / "out", text="sentence", label="label", prefix="p", shard_size=2, quiet=True)
    assert [s["samples"] for s in summary["shards"]] == [2, 2, 1]
    assert [s["shard"] for s in summary["shards"]] == ["p-000000.tar", "p-000001.tar", "p-000002.tar"]
    assert summary["labels"] == {"0": 3, "1": 2}
    got = _read(tmp_path / "out", "p")
    assert got == [(f"{i:06d}", r, i % 2) for i, r in enumerate(rows)]


def test_shuffle_is_seeded_and_keys_follow_rows(tmp_path: Path) -> None:
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"text": f"row {i}", "y": i % 3}) + "\n" for i in range(50)))
    a = t2s.convert(src, tmp_path / "a", text="text", label="y", prefix="s", shard_size=7, shuffle=3, quiet=True)
    t2s.convert(src, tmp_path / "b", text="text", label="y", prefix="s", shard_size=7, shuffle=3, quiet=True)
    ra, rb = _read(tmp_path / "a", "s"), _read(tmp_path / "b", "s")
    assert ra == rb
    assert [k for k, _, _ in ra] != sorted(k for k, _, _ in ra)  # shuffled
    assert {(k, t, y) for k, t, y in ra} == {(f"{i:06d}", f"row {i}", i % 3) for i in range(50)}
    assert (tmp_path / "a" / "s-000000.tar").read_bytes() == (tmp_path / "b" / "s-000000.tar").read_bytes()
    assert a["rows"] == 50


@pytest.mark.parametrize(
    ("content", "kwargs", "message"),
    [
        ("sentence\tlabel\nok\t1\n\t0\n", {}, "t.tsv:3: empty 'sentence'"),
        ("sentence\tlabel\nok\tpositive\n", {}, "t.tsv:2: label 'positive' in column 'label' is not an integer"),
        ("sentence\tlabel\nok\t7\n", {"labels": [0, 1]}, "t.tsv:2: label 7 is not one of --labels [0, 1]"),
        ("text\tlabel\nok\t1\n", {}, "t.tsv: no column ['sentence']; the columns are ['label', 'text']"),
        ("sentence\tlabel\nok\t1\textra\n", {}, "t.tsv:2: 3 fields, the header has 2"),
    ],
)
def test_bad_input_names_file_line_and_problem(tmp_path: Path, content: str, kwargs: dict, message: str) -> None:
    src = tmp_path / "t.tsv"
    src.write_text(content)
    with pytest.raises(t2s.ConversionError) as err:
        t2s.convert(src, tmp_path / "out", text="sentence", label="label", quiet=True, **kwargs)
    assert str(err.value).startswith(f"{src}{message[len('t.tsv') :]}")
    assert not list(tmp_path.glob("out/*.tar"))  # nothing half-written


def test_key_prefix_with_dot_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "t.tsv"
    src.write_text("sentence\tlabel\nok\t1\n")
    with pytest.raises(t2s.ConversionError, match=r"--key-prefix 'a\.b' contains a dot"):
        t2s.convert(src, tmp_path / "out", text="sentence", key_prefix="a.b", quiet=True)


@pytest.mark.skipif(not SST2.exists(), reason="../shared/data/sst2 not present")
def test_cli_on_real_sst2_dev(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.text_to_shards", str(SST2 / "dev.tsv"), "--out", str(tmp_path), "--text",
         "sentence", "--label", "label", "--labels", "0,1", "--prefix", "dev", "--shard-size", "500", "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    summary = json.loads(proc.stdout)
    assert summary["rows"] == 872
    assert [s["samples"] for s in summary["shards"]] == [500, 372]
    got = _read(tmp_path, "dev")
    lines = (SST2 / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert [(t, y) for _, t, y in got] == [(ln.split("\t")[0], int(ln.split("\t")[1])) for ln in lines]
    assert summary["labels"] == {"0": sum(y == 0 for _, _, y in got), "1": sum(y == 1 for _, _, y in got)}

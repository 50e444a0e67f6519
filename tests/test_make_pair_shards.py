"""tools/make_pair_shards.py: an img2dataset-shaped set of image-text pairs with a noise sidecar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image

from tools import make_pair_shards as mps

ROOT = Path(__file__).resolve().parent.parent

ARGS = ["--train", "60", "--test", "10", "--shard-size", "25", "--size", "16", "--workers", "1"]


def _make(out: Path, seed: int = 3, noise: float = 0.2) -> Path:
    mps.main(["--out", str(out), "--seed", str(seed), "--noise", str(noise), *ARGS])
    return out


def _read(out: Path, split: str) -> dict[tuple[str, str], dict]:
    """(shard, key) -> raw members of every pair of a split, through webdataset's reader."""
    urls = sorted(str(p) for p in (out / split).glob("*.tar"))
    return {(Path(s["__url__"]).name, s["__key__"]): s for s in wds.WebDataset(urls, shardshuffle=False)}


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.tar"))}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make(tmp_path_factory.mktemp("pairs") / "a")


def test_same_seed_same_bytes_other_seed_differs(made: Path, tmp_path: Path) -> None:
    again = _make(tmp_path / "b")
    assert _files(again) == _files(made)  # byte-identical shards
    assert (again / "info.json").read_bytes() == (made / "info.json").read_bytes()
    assert pq.read_table(again / "noise.parquet").equals(pq.read_table(made / "noise.parquet"))
    other = _files(_make(tmp_path / "c", seed=4))
    assert other.keys() == _files(made).keys()
    assert all(other[name] != data for name, data in _files(made).items())


def test_img2dataset_shard_and_key_naming(made: Path) -> None:
    assert sorted(p.name for p in (made / "train").iterdir()) == ["00000.tar", "00001.tar", "00002.tar"]
    assert sorted(p.name for p in (made / "test").iterdir()) == ["00000.tar"]
    pairs = _read(made, "train")
    # 25 pairs a shard: 2 index digits + 5 shard digits; pair i of shard s is s * 100 + i
    expected = [(f"{s:05d}.tar", f"{s * 100 + i:07d}") for s, n in ((0, 25), (1, 25), (2, 10)) for i in range(n)]
    assert sorted(pairs) == expected
    assert sorted(_read(made, "test")) == [("00000.tar", f"{i:07d}") for i in range(10)]
    # img2dataset's own examples: 10,000 a shard -> 9-digit keys; 2,000 a shard likewise
    assert mps.compute_key(12, 0, 2000, 10) == "000000012"
    assert mps.compute_key(0, 3, 2000, 10) == "000030000"
    assert mps.compute_key(5, 1, 10000, 100) == "000010005"
    assert mps.compute_key(7, 2, 10000, 123456) == "0000020007"  # 123,456 shards: 6 shard digits


def test_members_are_jpg_txt_json_like_img2dataset(made: Path) -> None:
    for (shard, key), s in _read(made, "train").items():
        assert {k for k in s if not k.startswith("__")} == {"jpg", "txt", "json"}
        assert s["__url__"].endswith(f"/train/{shard}")
        img = Image.open(io.BytesIO(s["jpg"]))
        assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (16, 16))
        meta = json.loads(s["json"])
        assert meta["key"] == key and meta["caption"] == s["txt"].decode() and meta["status"] == "success"
        assert meta["url"] == f"https://shapes.invalid/train/{key}.jpg"


def test_noise_sidecar_lists_exactly_the_mismatched_pairs(made: Path, tmp_path: Path) -> None:
    noisy = _read(made, "train")
    clean = _read(_make(tmp_path / "clean", noise=0.0), "train")  # same seed: same images, clean captions
    assert noisy.keys() == clean.keys()
    assert all(noisy[p]["jpg"] == clean[p]["jpg"] for p in noisy)
    differ = {p for p in noisy if noisy[p]["txt"] != clean[p]["txt"]}
    side = pq.read_table(made / "noise.parquet").to_pylist()
    assert {(r["shard"], r["key"]) for r in side} == differ
    assert len(side) == 5 + 5 + 2  # round(0.2 * n) per shard: 25, 25, 10 pairs
    for r in side:
        p, donor = (r["shard"], r["key"]), (r["shard"], r["donor_key"])
        assert donor != p and donor in clean  # a caption of another image of the same shard
        assert noisy[p]["txt"].decode() == r["caption"] == clean[donor]["txt"].decode()
        assert clean[p]["txt"].decode() == r["clean_caption"] != r["caption"]
    assert pq.read_table(tmp_path / "clean" / "noise.parquet").num_rows == 0
    info = json.loads((made / "info.json").read_text())
    assert info["train"] == {"pairs": 60, "shards": 3, "mismatched": 12}
    assert info["test"] == {"pairs": 10, "shards": 1, "mismatched": 0}


def test_held_out_pairs_are_clean_and_do_not_depend_on_noise(made: Path, tmp_path: Path) -> None:
    clean = _make(tmp_path / "clean", noise=0.0)
    assert (made / "test" / "00000.tar").read_bytes() == (clean / "test" / "00000.tar").read_bytes()


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        mps.main(["--out", str(tmp_path), "--noise", "1.0"])
    assert "--noise must be in [0, 1), got 1.0" in capsys.readouterr().err

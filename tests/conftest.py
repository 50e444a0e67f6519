"""Shared fixtures: real tar shards written with webdataset's TarWriter."""

from __future__ import annotations

from pathlib import Path

import pytest
import webdataset as wds


def write_shards(root: Path, sizes: list[int], prefix: str = "part") -> list[str]:
    """Shards ``{prefix}-0000.tar``... with ``sizes[i]`` samples each.

    Keys repeat across shards (``sample0000``...), so identity must include the shard.
    Each sample has a ``txt`` member "shard/index" and a ``cls`` member.
    """
    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for s, size in enumerate(sizes):
        path = root / f"{prefix}-{s:04d}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(size):
                w.write({"__key__": f"sample{i:04d}", "txt": f"{s}/{i}", "cls": str(i % 3)})
        urls.append(str(path))
    return urls


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    return write_shards(tmp_path / "shards", [30, 30, 30, 30])

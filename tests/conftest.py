"""Shared fixtures: real tar shards written with webdataset's TarWriter."""

from __future__ import annotations

import inspect
import shutil
import tempfile
from collections.abc import Iterator
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


def web_dataset(urls, **kw):
    """``wds.WebDataset(urls, **kw)`` on every webdataset release the project supports. 0.2.x
    takes no ``empty_check`` (it has no such check) nor ``seed``, and its ``shardshuffle=False``
    is a shuffle with a 0-sample buffer (neighbours swap), so there it is left out: no shard
    shuffle is 0.2's default."""
    if "empty_check" not in inspect.signature(wds.WebDataset.__init__).parameters:
        kw.pop("empty_check", None)
        kw.pop("seed", None)
        if kw.get("shardshuffle") is False:
            del kw["shardshuffle"]
    return wds.WebDataset(urls, **kw)


def tar_samples_per_shard(src):
    """Pipeline stage: ``wds.tarfile_to_samples()`` shard by shard, so a sample never continues
    across a shard's end (webdataset 1.x's behaviour; 0.2.x joins a shard's first sample to the
    previous shard's last when their keys are equal)."""
    for item in src:
        yield from wds.tarfile_to_samples()(iter([item]))


@pytest.fixture(autouse=True)
def _subprocess_scratch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Processes a test starts put their scratch folders (compaction's routing, planning's
    spill) in a short folder of their own, removed after the test: the crash tests SIGKILL
    processes, which cannot remove theirs, and /tmp would collect them. Not for the Ray tests:
    Ray keeps its session folders, sockets included, where it always does."""
    if request.module.__name__.endswith("test_ray_engine"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="sst-")
    monkeypatch.setenv("TMPDIR", folder)
    yield
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    return write_shards(tmp_path / "shards", [30, 30, 30, 30])


def seeded_run(path, n=200, shards=4, epochs=1, buckets=1):
    """A run directory whose loss table holds ``n`` samples over ``shards`` shards (epoch 0),
    partitioned into ``buckets`` buckets."""
    import numpy as np

    from seta_stream import RunDir, compact
    from seta_stream.testing import LossRecorder

    run = RunDir(path, create=True, settings={"buckets": buckets} if buckets > 1 else None)
    rng = np.random.default_rng(0)
    with LossRecorder(run, epoch=0) as rec:
        keys = [f"k{i:04d}" for i in range(n)]
        urls = [f"/d/shard-{i % shards}.tar" for i in range(n)]
        rec.record(keys, urls, rng.lognormal(size=n).astype(np.float32))
    compact(run)
    return run


SETA = dict(policy="seta", params=dict(r=0.1, k=5, alpha=0.6), epochs=10, seed=3)


def hold_plan_parquet(monkeypatch, epoch: int, release) -> list[str]:
    """Hold the writes of the parts of epoch ``epoch``'s plan.parquet until ``release`` (a
    threading.Event) is set, 60 s at most; every other Parquet write goes through. Returns the
    list of the paths written since, in order (plan.parquet's parts are written through
    ``_plans``' pyarrow.parquet or ``_runfs``', depending on the plan's identities)."""
    import seta_stream._store.planfiles as P
    import seta_stream._store.runfs as R

    real = P.pq
    written: list[str] = []

    class HeldParquet:
        def __getattr__(self, name):
            return getattr(real, name)

        def write_table(self, table, where, **options):
            if f"plans/epoch={epoch}/" in str(where):
                release.wait(60)
            real.write_table(table, where, **options)
            written.append(str(where))

    for module in (P, R):
        monkeypatch.setattr(module, "pq", HeldParquet())
    return written

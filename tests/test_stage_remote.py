"""The stage with its run directory on an S3 API (moto's server on loopback, through s3fs): a
DataLoader worker fetches the plan rows of the shards it opens, one range request each, and the
bytes it fetches grow with those shards, not with the plan."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow.ipc as ipc
import pytest
import webdataset as wds
from conftest import write_shards
from readers import check_readers_agree
from servers import s3_endpoint

import seta_stream as seta
from seta_stream import RunDir, load_plan, plan_epoch

pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e '.[dev]')")


@dataclass
class Fetched:
    """One request the S3 server answered: method, path, Range header, body bytes sent."""

    method: str
    path: str
    range: str | None
    bytes: int


@dataclass
class CountingS3:
    endpoint: str
    log: list[Fetched] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fetched(self, prefix: str) -> list[Fetched]:
        with self.lock:
            return [f for f in self.log if f.path.startswith(prefix) and f.method == "GET"]

    def clear(self) -> None:
        with self.lock:
            self.log.clear()


class _Counting:
    """WSGI middleware: log every request with the bytes of the body it answers."""

    def __init__(self, app, server: CountingS3) -> None:
        self.app, self.server = app, server

    def __call__(self, environ, start_response):
        body = self.app(environ, start_response)
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()
            with self.server.lock:
                self.server.log.append(
                    Fetched(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("HTTP_RANGE"), sent)
                )


@contextlib.contextmanager
def counting_s3_server() -> Iterator[CountingS3]:
    """moto's S3 app on 127.0.0.1 (random port) behind :class:`_Counting`; ``s3://`` URLs go to
    it (fsspec config, inherited by forked DataLoader workers) while the block runs."""
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    server = CountingS3(endpoint="")
    httpd = make_server("127.0.0.1", 0, _Counting(DomainDispatcherApplication(create_backend_app), server), True)
    server.endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with s3_endpoint(server.endpoint):
            yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture(scope="module")
def s3():
    import s3fs

    with counting_s3_server() as server:
        s3fs.S3FileSystem().mkdir("stage-runs")  # moto keeps its buckets after a server stops: a name of its own
        yield server


PER_SHARD = 200
READ = 3  # shards the worker reads


def key(s: int, i: int) -> str:
    return f"{s}/{i}/{i:05d}_Word_{i % 13}"  # MJSynth-like keys


def write_read_shards(root) -> list[str]:
    """The READ shards the worker opens (shard-00000.tar...), real tar files."""
    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for s in range(READ):
        path = root / f"shard-{s:05d}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(PER_SHARD):
                w.write({"__key__": key(s, i), "txt": f"{s}/{i}"})
        urls.append(str(path))
    return urls


def planned(url: str, shards: int, buckets: int = 1) -> RunDir:
    """A run on S3 whose plan lists ``shards`` shards of PER_SHARD samples (half kept)."""
    run = RunDir(url, create=True, settings={"buckets": buckets})
    population = [(f"shard-{s:05d}.tar", key(s, i)) for s in range(shards) for i in range(PER_SHARD)]
    plan_epoch(run, 0, policy="random", params={"r": 0.5}, epochs=2, seed=7, population=population)
    return run


def one_worker_epoch(run_url: str, urls: list[str]) -> list[tuple[str, str, float]]:
    torch = pytest.importorskip("torch")
    ds = seta.attach(wds.WebDataset(urls, shardshuffle=False, empty_check=False), run_url)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
    return [(s["__url__"].rsplit("/", 1)[1], s["__key__"], float(s["__weight__"])) for s in loader]


def kept_of(run: RunDir, shards: set[str]) -> set[tuple[str, str, float]]:
    plan = load_plan(run, 0)
    return {
        (s, k, w)
        for s, k, keep, w in zip(*(plan.column(c).to_pylist() for c in ("shard", "key", "keep", "weight")))
        if keep and s in shards
    }


def test_a_worker_fetches_the_plan_rows_of_the_shards_it_reads_not_the_plan(tmp_path, s3):
    urls = write_read_shards(tmp_path / "shards")
    read = {os.path.basename(u) for u in urls}
    fetched = {}
    for shards in (20, 200):  # the same shards read from a plan of 4,000 samples and one of 40,000
        run = planned(f"s3://stage-runs/grow-{shards}", shards)
        plan_dir = f"/stage-runs/grow-{shards}/plans/epoch=0/"
        s3.clear()
        got = one_worker_epoch(run.url, urls)
        log = s3.fetched(plan_dir)  # what the worker fetched of the plan
        assert len(got) == len(set(got)) and set(got) == kept_of(run, read)
        ranges = {r["shard"]: r for r in run.read_arrow("plans/epoch=0/shards.arrow").to_pylist()}
        stage = [f for f in log if f.path.endswith("/stage.arrow")]
        # one range request per shard read, for exactly that shard's record batch
        assert sorted(f.range for f in stage) == sorted(
            f"bytes={ranges[s]['offset']}-{ranges[s]['offset'] + ranges[s]['length'] - 1}" for s in read
        )
        assert sum(f.bytes for f in stage) == sum(ranges[s]["length"] for s in read)
        assert {f.path.removeprefix(plan_dir) for f in log} == {"stage.arrow", "shards.arrow", "summary.json"}
        # attach's two stages share the worker's view: the summary and the index are read once
        fetches = Counter(f.path.removeprefix(plan_dir) for f in log)
        assert (fetches["summary.json"], fetches["shards.arrow"]) == (1, 1)
        plan_bytes = sum(f.bytes for f in log)
        size = run.fs.size(run.path("plans/epoch=0/stage.arrow"))
        fetched[shards] = (plan_bytes, sum(f.bytes for f in stage), size)
    (small, small_stage, small_size), (large, large_stage, large_size) = fetched[20], fetched[200]
    assert large_stage == small_stage  # fixed-width rows: the same shards weigh the same
    assert large_size > 9 * small_size
    # 10x the plan: only shards.arrow (about 15 bytes a shard, read once) and summary.json grow
    assert large - small < 180 * 40
    assert large < large_size / 20  # the whole stage.arrow of the larger plan: 540 KB


def test_a_worker_of_a_partitioned_plan_fetches_the_index_of_its_shards_buckets_only(tmp_path, s3):
    """A partitioned plan has a stage file and a shard index per bucket (stage/): the worker
    fetches the summary, the index of each bucket its shards are in, and one range of that
    bucket's stage file per shard; no file of the whole plan."""
    urls = write_read_shards(tmp_path / "shards")
    read = sorted(os.path.basename(u) for u in urls)
    for shards, buckets in ((20, 2), (200, 20)):  # 10 shards a bucket in both
        run = planned(f"s3://stage-runs/parts-{shards}", shards, buckets)
        plan_dir = f"/stage-runs/parts-{shards}/plans/epoch=0/"
        assert sorted(run.fs.ls(run.path("plans/epoch=0"), detail=False)) == sorted(
            run.path(f"plans/epoch=0/{n}") for n in ("plan.parquet", "stage", "summary.json")
        )
        mine = {seta.ids.shard_bucket(s, buckets) for s in read}
        s3.clear()
        got = one_worker_epoch(run.url, urls)
        log = s3.fetched(plan_dir)  # what the worker fetched of the plan
        assert len(got) == len(set(got)) and set(got) == kept_of(run, set(read))
        indexes = {f"stage/shards-{b:05d}.arrow" for b in mine}
        assert {f.path.removeprefix(plan_dir) for f in log} == {"summary.json"} | indexes | {
            f"stage/stage-{b:05d}.arrow" for b in mine
        }
        ranges = {}
        for b in mine:
            index = ipc.open_file(run.open(f"plans/epoch=0/stage/shards-{b:05d}.arrow")).read_all().to_pylist()
            assert {r["shard"] for r in index} == {
                f"shard-{s:05d}.tar" for s in range(shards) if seta.ids.shard_bucket(f"shard-{s:05d}.tar", buckets) == b
            }
            ranges |= {r["shard"]: (b, r["offset"], r["length"]) for r in index}
        stage = [f for f in log if "/stage/stage-" in f.path]
        # one range request per shard read, for exactly that shard's record batch in its
        # bucket's file; the summary and each index once (attach's two stages share them)
        fetches = Counter(f.path.removeprefix(plan_dir) for f in log)
        assert {p: fetches[p] for p in {"summary.json"} | indexes} == {p: 1 for p in {"summary.json"} | indexes}
        assert sorted((f.path.removeprefix(plan_dir), f.range) for f in stage) == sorted(
            (f"stage/stage-{ranges[s][0]:05d}.arrow", f"bytes={ranges[s][1]}-{ranges[s][1] + ranges[s][2] - 1}")
            for s in read
        )
        # each index read whole, and it lists its bucket's shards only (about 10 here)
        for f in log:
            if f.path.removeprefix(plan_dir) in indexes:
                assert f.range is None and f.bytes == run.fs.size(
                    run.path(f"plans/epoch=0/{f.path.removeprefix(plan_dir)}")
                )


def test_the_three_readers_agree_with_the_run_directory_on_s3(tmp_path, s3):
    urls = write_shards(tmp_path / "shards", [30, 25, 30])
    run = RunDir("s3://stage-runs/agree", create=True)
    plan_epoch(run, 0, policy="random", params={"r": 0.5}, epochs=2, seed=3, population=seta.list_samples(urls))
    s3.clear()
    samples, counts = check_readers_agree(urls, run.url)
    assert counts == {"kept": len(samples), "dropped": 85 - len(samples), "absent_kept": 0, "absent_dropped": 0}
    assert {(os.path.basename(s["__url__"]), s["__key__"]) for s in samples} == {
        (s, k) for s, k, _ in kept_of(run, {os.path.basename(u) for u in urls})
    }
    # every read of stage.arrow was a range request for one shard's batch
    stage = s3.fetched("/stage-runs/agree/plans/epoch=0/stage.arrow")
    lengths = {r["length"] for r in ipc.open_file(run.open("plans/epoch=0/shards.arrow")).read_all().to_pylist()}
    assert stage and all(f.range is not None and f.bytes in lengths for f in stage)

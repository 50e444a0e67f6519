"""Shards and runs behind real servers on loopback: HTTP with Range support, S3 (moto's server
through s3fs), signed-URL-like query strings and ``pipe:curl`` URLs, through all three readers."""

from __future__ import annotations

import os
import random
import warnings
import zlib
from collections import Counter

import numpy as np
import pytest
import webdataset as wds
from servers import have_curl, moto_s3_server, range_http_server

import seta_stream as seta
from seta_stream import index_shard
from seta_stream._reading.reader import read_kept
from seta_stream._reading.shardindex import index_name
from seta_stream.errors import IndexMismatch, IndexMissing, InvalidInputError
from seta_stream.ids import shard_name
from seta_stream.index import load_index

pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server (pip install -e '.[dev]')")
pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install -e '.[dev]')")

N_SHARDS, PER_SHARD = 4, 12


def write_shards(root, n=N_SHARDS, per=PER_SHARD, seed=0, prefix="shard", key="k"):
    """Shards with members of several sizes (so that dropped samples leave gaps worth skipping);
    the same ``seed`` gives the same member sizes whatever the one-letter ``key`` prefix."""
    root.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    paths = []
    for s in range(n):
        path = root / f"{prefix}-{s:03d}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(per):
                w.write(
                    {
                        "__key__": f"{key}{i:04d}",
                        "jpg": rnd.randbytes(rnd.choice([0, 511, 512, 3000, 70000])),
                        "cls": f"{s}/{i}",
                    }
                )
        paths.append(str(path))
    return paths


def reference(local_paths, run, urls):
    """streaming + keep_filter over the local copies, with __url__ as the remote reader has it."""
    by_name = dict(zip([os.path.basename(p) for p in local_paths], urls))
    out = list(wds.DataPipeline(wds.SimpleShardList(local_paths), wds.tarfile_to_samples(), seta.keep_filter(run)))
    for s in out:
        s["__url__"] = by_name[os.path.basename(s["__url__"])]
    return out


def plan_random(run, population, r=0.5, epoch=0, seed=5):
    seta.plan_epoch(run, epoch, policy="random", params={"r": r}, epochs=3, seed=seed, population=population)


def counters():
    return Counter(seta.stage_counters())


def delta(before):
    return counters() - before


# ---------------------------------------------------------------------------------------- HTTP


@pytest.fixture
def http_shards(tmp_path):
    paths = write_shards(tmp_path / "www" / "data")
    with range_http_server(tmp_path / "www", signed_prefix="/signed/") as server:
        yield server, paths


def test_http_read_kept_issues_range_requests_for_the_kept_bytes_only(tmp_path, http_shards):
    server, paths = http_shards
    for p in paths:
        index_shard(p)  # sidecars next to the shards, served beside them
    urls = [f"{server.url}/data/{os.path.basename(p)}" for p in paths]
    run = seta.RunDir(str(tmp_path / "run"), create=True)
    plan_random(run, seta.list_samples(urls))
    expected = reference(paths, run, urls)
    assert 0 < len(expected) < N_SHARDS * PER_SHARD
    server.clear()
    before = counters()
    got = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    d = delta(before)
    assert got == expected
    assert d["index_missing"] == d["index_mismatch"] == 0
    tar_gets = server.requests(".tar", "GET")
    assert tar_gets and all(r.range is not None and r.status == 206 for r in tar_gets)
    assert len(tar_gets) == d["range_reads"]
    served = 0
    for r in tar_gets:
        a, b = r.range[len("bytes=") :].split("-")
        served += int(b) - int(a) + 1
    assert served == d["bytes_read"] < sum(os.path.getsize(p) for p in paths)
    assert [r.path for r in server.requests(".idx.json", "GET")] == [
        f"/data/{os.path.basename(p)}.idx.json" for p in paths
    ]


def test_http_without_index_streams_and_a_server_ignoring_ranges_is_refused(tmp_path):
    paths = write_shards(tmp_path / "www")
    index_shard(paths[0])
    run = seta.RunDir(str(tmp_path / "run"), create=True)
    plan_random(run, seta.list_samples(paths))
    with range_http_server(tmp_path / "www", ranges=False) as server:
        urls = [f"{server.url}/{os.path.basename(p)}" for p in paths]
        expected = reference(paths, run, urls)
        before = counters()
        with pytest.warns(UserWarning, match=r"read_kept streams http://.*/shard-000.tar .* does not honour range"):
            assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run))) == expected
        d = delta(before)
        assert d["index_mismatch"] == 1 and d["index_missing"] == N_SHARDS - 1
        gets = server.requests(".tar", "GET")
        assert {r.path for r in gets if r.range} == {"/shard-000.tar"}  # answered whole (200), then streamed
        assert all(r.status == 200 for r in gets)
        with pytest.raises(InvalidInputError, match=r"cannot write its index at http://.*HTTP servers are read-only"):
            index_shard(urls[1])
        with pytest.raises(IndexMismatch, match=r"got \d+; expected the exact range.*does not honour range requests"):
            list(wds.DataPipeline(wds.SimpleShardList(urls[:1]), read_kept(run, on_mismatch="raise")))


def signed(server, path, signature="ok"):
    return f"{server.url}/signed/data/{os.path.basename(path)}?X-Amz-Expires=60&X-Amz-Signature={signature}"


def test_signed_urls_never_look_the_index_up_after_the_query(tmp_path, http_shards):
    server, paths = http_shards
    for p in paths:
        index_shard(p)  # sidecars exist beside the unsigned path: they must not be used
    urls = [signed(server, p) for p in paths]
    run = seta.RunDir(str(tmp_path / "run"), create=True)
    plan_random(run, seta.list_samples(paths))
    expected = reference(paths, run, urls)
    server.clear()
    before = counters()
    with pytest.warns(UserWarning, match=r"has a query string \(a signed URL\?\); its index is looked up only in an "):
        got = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    assert got == expected
    assert delta(before)["index_missing"] == N_SHARDS
    assert server.log and all(r.status == 200 and "X-Amz-Signature=ok" in r.query for r in server.log)
    assert not [r for r in server.log if "idx" in r.path or "idx" in r.query]
    with warnings.catch_warnings():  # once per process and folder
        warnings.simplefilter("error")
        assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run))) == expected
    with pytest.raises(IndexMissing, match=r"has a query string .* expected an index_dir"):
        index_shard(urls[0])
    with pytest.raises(IndexMissing, match=r"has a query string"):
        list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, on_missing="raise")))

    # with an index_dir: indexed through the signed URL, read by range requests that keep the query
    idx_dir = str(tmp_path / "idx")
    written = [index_shard(u, idx_dir) for u in urls]
    assert [os.path.basename(w) for w in written] == [
        index_name(f"{server.url}/signed/data/{os.path.basename(p)}") for p in paths
    ]
    assert load_index(signed(server, paths[0], "ok-another-signature"), idx_dir)["location"] == urls[0].split("?")[0]
    server.clear()
    before = counters()
    assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, index_dir=idx_dir))) == expected
    d = delta(before)
    assert d["index_missing"] == d["index_mismatch"] == 0 and d["range_reads"] > 0
    gets = server.requests(".tar", "GET")
    assert len(gets) == d["range_reads"] and all(r.status == 206 and "X-Amz-Signature=ok" in r.query for r in gets)
    # a wrong signature is refused by the server (fsspec reports it as not found), never streamed silently
    with pytest.raises(FileNotFoundError, match=r"X-Amz-Signature=bad"):
        list(
            wds.DataPipeline(wds.SimpleShardList([signed(server, paths[0], "bad")]), read_kept(run, index_dir=idx_dir))
        )


# ------------------------------------------------------------------------------------------ S3


@pytest.fixture(scope="module")
def s3():
    with moto_s3_server() as endpoint:
        import s3fs

        fs = s3fs.S3FileSystem()
        for bucket in ("data", "runs"):
            fs.mkdir(bucket)
        yield fs, endpoint


def upload(fs, paths, prefix):
    urls = []
    for p in paths:
        url = f"s3://data/{prefix}/{os.path.basename(p)}"
        fs.put_file(p, url)
        urls.append(url)
    fs.invalidate_cache()
    return urls


def test_s3_run_and_shards_with_index_present_missing_and_stale(tmp_path, s3):
    fs, _ = s3
    paths = write_shards(tmp_path / "a")
    urls = upload(fs, paths, "pms")
    for u in urls[:3]:
        index_shard(u)  # sidecars on s3; shard 3 has none
    assert fs.exists(urls[0] + ".idx.json") and not fs.exists(urls[3] + ".idx.json")
    run = seta.RunDir("s3://runs/pms", create=True)
    plan_random(run, seta.list_samples(urls))
    expected = reference(paths, run, urls)
    assert 0 < len(expected) < N_SHARDS * PER_SHARD

    before = counters()
    got = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept("s3://runs/pms")))
    d = delta(before)
    assert got == expected
    assert d["index_missing"] == 1 and d["index_mismatch"] == 0
    assert 0 < d["bytes_read"] < sum(os.path.getsize(p) for p in paths[:3])

    # stale: shard 1 is replaced by other bytes after indexing
    other = write_shards(tmp_path / "b", seed=9)
    fs.put_file(other[1], urls[1])
    fs.invalidate_cache()
    with pytest.raises(
        IndexMismatch, match=r"shard shard-001.tar: index s3://data/pms/shard-001.tar.idx.json describes"
    ):
        load_index(urls[1])
    now = [paths[0], other[1], paths[2], paths[3]]
    expected = reference(now, run, urls)
    before = counters()
    with pytest.warns(UserWarning, match=r"read_kept streams s3://data/pms/shard-001.tar .* describes \d+ bytes"):
        assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run))) == expected
    d = delta(before)
    assert d["index_missing"] == 1 and d["index_mismatch"] == 1
    with pytest.raises(IndexMismatch):
        list(wds.DataPipeline(wds.SimpleShardList(urls[1:2]), read_kept(run, on_mismatch="raise")))


def test_s3_indexes_written_locally_and_synced_with_their_shards_are_used(tmp_path, s3):
    # `seta-stream index` where the shards are made, then shards and sidecars uploaded together
    # (`aws s3 sync`): the objects' LastModified is the upload time, not the local mtime
    fs, _ = s3
    paths = write_shards(tmp_path / "made")
    for p in paths:
        os.utime(p, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
        index_shard(p)
    urls = upload(fs, paths, "synced")
    for p, u in zip(paths, urls):
        fs.put_file(p + ".idx.json", u + ".idx.json")
    fs.invalidate_cache()
    assert load_index(urls[0])["mtime_ns"] == 1_600_000_000_000_000_000  # old index files read as they are
    assert fs.info(urls[0])["LastModified"].timestamp() > 1_700_000_000
    run = seta.RunDir("s3://runs/synced", create=True)
    plan_random(run, seta.list_samples(urls))
    plan = seta.load_plan(run, 0).to_pylist()
    kept = [(r["shard"], r["key"]) for r in plan if r["keep"]]
    assert 0 < len(kept) < N_SHARDS * PER_SHARD
    expected = reference(paths, run, urls)
    before = counters()
    got = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    d = delta(before)
    assert got == expected
    assert sorted((shard_name(s["__url__"]), s["__key__"]) for s in got) == sorted(kept)
    assert d["index_missing"] == d["index_mismatch"] == 0  # every shard through its index
    assert d["range_reads"] > 0 and 0 < d["bytes_read"] < sum(os.path.getsize(p) for p in paths)

    # a different shard of the same size under the name of shard 1 (other keys, same member
    # sizes): its index is refused by the member headers, the shard streamed, and the user told
    other = write_shards(tmp_path / "other", seed=0, key="q")
    assert os.path.getsize(other[1]) == os.path.getsize(paths[1])
    fs.put_file(other[1], urls[1])
    fs.invalidate_cache()
    load_index(urls[1])  # the size agrees: only the member headers can tell
    expected = reference([paths[0], other[1], paths[2], paths[3]], run, urls)
    before = counters()
    with pytest.warns(UserWarning, match=r"read_kept streams s3://data/synced/shard-001.tar instead of reading"):
        got = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    d = delta(before)
    assert got == expected and {s["__key__"][0] for s in got if s["__url__"] == urls[1]} <= {"q"}
    assert d["index_mismatch"] == 1 and d["index_missing"] == 0
    with pytest.raises(IndexMismatch, match=r"the tar header at byte \d+ is not that of member 'k\d{4}\."):
        list(wds.DataPipeline(wds.SimpleShardList(urls[1:2]), read_kept(run, on_mismatch="raise")))


def test_s3_index_dir_keeps_same_named_shards_apart(tmp_path, s3):
    fs, _ = s3
    a = write_shards(tmp_path / "a", n=1, prefix="part")
    b = write_shards(tmp_path / "b", n=1, seed=3, prefix="part")
    urls = upload(fs, a, "clash/a") + upload(fs, b, "clash/b")
    assert shard_name(urls[0]) == shard_name(urls[1]) == "part-000.tar"
    idx_dir = "s3://data/clash-idx"
    written = [index_shard(u, idx_dir) for u in urls]
    assert len(set(written)) == 2 and len(fs.ls(idx_dir, refresh=True)) == 2
    run = seta.RunDir("s3://runs/clash", create=True, settings={"shard_depth": 2})
    plan_random(run, seta.list_samples(urls, shard_depth=2))
    expected = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))  # no sidecars: streamed
    assert expected == reference_by_url(a + b, run, urls)
    assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, index_dir=idx_dir))) == expected
    fs.copy(written[0], written[1])  # a's index under b's name
    with pytest.raises(IndexMismatch, match=r"describes the shard at 's3://data/clash/a/part-000.tar', expected"):
        load_index(urls[1], idx_dir)


def reference_by_url(local_paths, run, urls):
    out = []
    for p, u in zip(local_paths, urls):
        out += reference([p], run, [u])
    return out


# ------------------------------------------------------------------------------- end to end


def losses_of(keys, urls):
    crc = [zlib.crc32(f"{shard_name(u)}/{k}".encode()) for k, u in zip(keys, urls)]
    return np.array(crc, dtype=np.float32) % 1000 / 100


def three_epochs(run, population, make_samples, settings=None):
    """Train 3 epochs with a Pruner; return per epoch (delivered, planned) multisets of (shard, key, weight)."""
    pruner = seta.Pruner(
        run, policy="random", params={"r": 0.5}, epochs=3, seed=11, population=population, settings=settings
    )
    out = []
    try:
        for epoch in range(3):
            pruner.start_epoch(epoch)
            plan = seta.load_plan(run, epoch)
            planned = Counter(
                (s, k, w)
                for s, k, keep, w in zip(
                    plan.column("shard").to_pylist(),
                    plan.column("key").to_pylist(),
                    plan.column("keep").to_pylist(),
                    plan.column("weight").to_pylist(),
                )
                if keep
            )
            samples = make_samples()
            keys = [s["__key__"] for s in samples]
            urls = [s["__url__"] for s in samples]
            delivered = Counter((shard_name(s["__url__"]), s["__key__"], float(s["__weight__"])) for s in samples)
            for s in samples:  # bytes of the right sample
                assert s["cls"].decode() == f"{int(shard_name(s['__url__'])[6:9])}/{int(s['__key__'][1:])}"
            if samples:
                pruner.record(keys, urls, losses_of(keys, urls))
            out.append((delivered, planned))
    finally:
        pruner.close()
    return out


def check_epochs(result):
    sizes = []
    for delivered, planned in result:
        assert delivered == planned
        assert max(delivered.values()) == 1
        sizes.append(sum(delivered.values()))
    assert all(0 < n < N_SHARDS * PER_SHARD for n in sizes)
    assert len({frozenset(d) for d, _ in result}) == 3  # a fresh subset every epoch


def pipeline(urls, *stages):
    return lambda: list(wds.DataPipeline(wds.SimpleShardList(urls), *stages))


def test_end_to_end_read_kept_over_http_and_signed_http(tmp_path, http_shards):
    server, paths = http_shards
    for p in paths:
        index_shard(p)
    urls = [f"{server.url}/data/{os.path.basename(p)}" for p in paths]
    pop = seta.list_samples(urls)
    server.clear()  # the listing's requests are not the reader's
    check_epochs(three_epochs(str(tmp_path / "run1"), pop, pipeline(urls, read_kept(str(tmp_path / "run1")))))
    assert server.requests(".tar", "GET") and all(r.range for r in server.requests(".tar", "GET"))

    signed_urls = [signed(server, p) for p in paths]
    idx_dir = str(tmp_path / "idx")
    for u in signed_urls:
        index_shard(u, idx_dir)
    pop = seta.list_samples(signed_urls)
    for buckets in (1, 3):  # a one-bucket plan, and a partitioned one (per-bucket stage files)
        run = str(tmp_path / f"run-signed-{buckets}")
        reader = pipeline(signed_urls, read_kept(run, index_dir=idx_dir))
        check_epochs(three_epochs(run, pop, reader, settings={"buckets": buckets}))
    assert os.listdir(tmp_path / "run-signed-3/plans/epoch=2/stage")


def test_end_to_end_read_kept_over_http_in_two_forked_workers(tmp_path, http_shards):
    torch = pytest.importorskip("torch")
    server, paths = http_shards
    for p in paths:
        index_shard(p)
    urls = [f"{server.url}/data/{os.path.basename(p)}" for p in paths]
    run = str(tmp_path / "run")
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_worker, read_kept(run))

    def loader():
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        return list(dl)

    check_epochs(three_epochs(run, seta.list_samples(urls), loader))


def test_end_to_end_read_kept_over_s3(tmp_path, s3):
    fs, _ = s3
    paths = write_shards(tmp_path / "s")
    urls = upload(fs, paths, "e2e")
    for u in urls[1:]:
        index_shard(u)  # shard 0 is streamed every epoch
    run = "s3://runs/e2e"
    check_epochs(three_epochs(run, seta.list_samples(urls), pipeline(urls, read_kept(run))))


curl_needed = pytest.mark.skipif(
    have_curl() is None, reason="pipe:curl URLs need the curl program (apt-get install -y curl)"
)


@curl_needed
@pytest.mark.parametrize("reader", ["read_kept", "kept_tar_samples", "attach"])
def test_end_to_end_pipe_curl_urls_through_every_reader(tmp_path, http_shards, reader):
    server, paths = http_shards
    for p in paths[:2]:
        index_shard(p)  # read_kept range-reads shards 0, 1 and runs curl for 2, 3
    http_urls = [f"{server.url}/data/{os.path.basename(p)}" for p in paths]
    urls = [f"pipe:curl -s -L {u} || true" for u in http_urls]
    run = str(tmp_path / "run")
    if reader == "read_kept":
        make = pipeline(urls, read_kept(run))
    elif reader == "kept_tar_samples":
        make = pipeline(urls, seta.skip_shards(run), seta.kept_tar_samples(run))
    else:
        seta.RunDir(run, create=True)  # attach opens the run when it is called
        ds = seta.attach(wds.WebDataset(urls, shardshuffle=False, empty_check=False), run)
        make = lambda: list(ds)  # noqa: E731
    population = seta.list_samples(http_urls)
    server.clear()
    check_epochs(three_epochs(run, population, make))
    gets = server.requests(".tar", "GET")
    if reader == "read_kept":
        ranged = {r.path for r in gets if r.range}
        assert ranged == {f"/data/{os.path.basename(p)}" for p in paths[:2]}
        assert {r.path for r in gets if not r.range} == {f"/data/{os.path.basename(p)}" for p in paths[2:]}
    else:
        assert gets and all(r.range is None for r in gets)  # curl fetched whole shards


@curl_needed
def test_pipe_curl_of_a_signed_url_range_reads_with_its_query_from_an_index_dir(tmp_path, http_shards):
    server, paths = http_shards
    urls = [f"pipe:curl -s -L '{signed(server, p)}' || true" for p in paths]
    idx_dir = str(tmp_path / "idx")
    for u in urls[:2]:
        index_shard(u, idx_dir)  # read through the command's signed URL
    run = seta.RunDir(str(tmp_path / "run"), create=True)
    plan_random(run, seta.list_samples(paths))
    expected = reference(paths, run, urls)
    server.clear()
    before = counters()
    assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, index_dir=idx_dir))) == expected
    d = delta(before)
    assert d["index_missing"] == 2 and d["index_mismatch"] == 0
    gets = server.requests(".tar", "GET")
    assert all(r.status in (200, 206) and "X-Amz-Signature=ok" in r.query for r in gets)
    assert {r.path for r in gets if r.range} == {f"/signed/data/{os.path.basename(p)}" for p in paths[:2]}
    assert {r.path for r in gets if not r.range} == {f"/signed/data/{os.path.basename(p)}" for p in paths[2:]}
    with pytest.warns(UserWarning, match=r"has a query string"):  # no index_dir: the command runs
        assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run))) == expected

"""The run directory: layout, storage access (local or any fsspec URL), atomic publish, locks.

Every other module reaches storage through :class:`RunDir`, never through ``open``/``os``.
Invariants kept here:

* every file that another process reads is *published*: written completely under a temporary
  name and renamed into place (local disk), or written with one PUT (object stores, where a
  single-object write is atomic); a reader sees a complete old or a complete new file. A
  Parquet folder (``publish_parquet_parts``) is written as a temporary folder and renamed into
  place locally; on object stores its parts are PUT one by one, and the JSON file written after
  it (a plan's ``summary.json``) is what says it is complete;
* nothing already published is modified in place (new content gets a new name, except the
  small JSON pointers ``table/manifest.json`` and ``state.json`` that are replaced whole);
* ``seta-stream.json`` names the format and its version; a newer version is refused.

Layout (docs/format.md is the authority)::

    RUN_DIR/seta-stream.json
    RUN_DIR/losses/rank=R/epoch=E/part-*.parquet
    RUN_DIR/losses-quarantine/...            parts set aside by ``compact(..., on_corrupt="skip")``
    RUN_DIR/table/manifest.json, table/table-*.parquet, table/keys-*.arrow
    RUN_DIR/plans/epoch=E/{plan.parquet/part-*.parquet, summary.json, stage.arrow, shards.arrow}
    RUN_DIR/state.json
    RUN_DIR/locks/*.lock
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from ..errors import InvalidInputError, RunFormatError, RunLockedError
from .layout import FORMAT_FILE, lock_file

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "RunDir",
    "DEFAULT_SETTINGS",
    "BUCKET_ROWS",
    "ONE_BUCKET_ROWS",
    "bucket_count",
    "new_run_buckets",
    "write_arrow",
]

FORMAT_NAME = "seta-stream-run"
#: The newest format version this code reads and writes. A run with one bucket is written in
#: version 1 (the layout every earlier release reads); a partitioned run in version 2.
FORMAT_VERSION = 2
#: Rows per bucket the default bucket count aims at (``buckets`` unset, ``dataset_size`` set):
#: compaction holds about one bucket at a time and planning two (docs/benchmarks.md, "Web scale").
BUCKET_ROWS = 1 << 23
#: Samples of ``dataset_size`` up to which a new run stays in one bucket (``buckets`` unset).
#: Why: at 15M samples two buckets made every plan and the steady compaction slower and the
#: plans' peak RSS no lower; they lowered only the compactions' peaks (docs/benchmarks.md, "One
#: bucket or two at 15M", which also gives the peaks of a one-bucket run of 2^24 samples).
ONE_BUCKET_ROWS = 1 << 24
_MAX_BUCKETS = 4096

#: Run-level settings fixed when the run is created (stored in seta-stream.json).
DEFAULT_SETTINGS: dict[str, Any] = {
    "shard_depth": 1,  # trailing path components of __url__ that name a shard
    "ema_beta2": 0.9,  # EMA factor of the loss table's `ema` column (docs/algorithms.md §0.6)
    "dataset_size": None,  # n_ref for the EMA start value 1/n (None: table size)
    "buckets": None,  # partitions of the loss table and plans (None: from dataset_size, else 1)
}


def bucket_count(settings: dict[str, Any]) -> int:
    """The number of buckets of a partitioned run (format version 2) with these settings:
    ``buckets`` if set, else one per :data:`BUCKET_ROWS` of ``dataset_size`` (at most 4096),
    else 1. (Whether a new run is partitioned at all: :func:`new_run_buckets`.)"""
    explicit = settings.get("buckets")
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or not 1 <= explicit <= _MAX_BUCKETS:
            raise RunFormatError(
                f"run setting buckets={explicit!r}; expected an integer from 1 to {_MAX_BUCKETS} (or None: "
                "one bucket up to 16,777,216 samples of dataset_size, else one per 8,388,608)"
            )
        return explicit
    size = settings.get("dataset_size")
    if not size:
        return 1
    return max(1, min(_MAX_BUCKETS, -(-int(size) // BUCKET_ROWS)))


def new_run_buckets(settings: dict[str, Any]) -> int:
    """The number of buckets a new run with these settings is created with: ``buckets`` if set;
    else 1 up to :data:`ONE_BUCKET_ROWS` samples of ``dataset_size``, and one per
    :data:`BUCKET_ROWS` above (:func:`bucket_count`). A run keeps the count it was created with:
    one created partitioned by an earlier release below that size stays so."""
    size = settings.get("dataset_size")
    if settings.get("buckets") is None and (not size or int(size) <= ONE_BUCKET_ROWS):
        return 1
    return bucket_count(settings)


class RunDir:
    """A run directory on local disk or behind an fsspec URL (``memory://``, ``s3://``...).

    ``RunDir(url, create=True)`` creates the directory and its format file if missing;
    ``create=False`` requires an existing run. Picklable (the URL is re-resolved), so it can
    be handed to DataLoader workers started by fork or spawn.
    """

    url: str
    storage_options: dict[str, Any]

    def __init__(
        self,
        url: str | os.PathLike[str] | RunDir,
        *,
        create: bool = False,
        settings: dict[str, Any] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(url, RunDir):
            storage_options = url.storage_options
            url = url.url
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.fs: fsspec.AbstractFileSystem = fs
        self.root: str = root.rstrip("/") or "/"
        self.is_local = isinstance(fs, LocalFileSystem)
        self._settings: dict[str, Any] | None = None
        self._version = 1
        self._open(create=create, settings=settings)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.url, self.storage_options))

    def __repr__(self) -> str:
        return f"RunDir({self.url!r})"

    # ------------------------------------------------------------------ format file
    def _open(self, *, create: bool, settings: dict[str, Any] | None) -> None:
        fmt_path = self.path(FORMAT_FILE)
        if self.fs.exists(fmt_path):
            info = self._read_format(fmt_path)
            self._settings = {**DEFAULT_SETTINGS, **info.get("settings", {})}
            self._version = int(info["version"])
            if settings:
                differing = {k: (self._settings.get(k), v) for k, v in settings.items() if self._settings.get(k) != v}
                if differing:
                    detail = ", ".join(f"{k}: run has {a!r}, asked {b!r}" for k, (a, b) in differing.items())
                    raise RunFormatError(
                        f"{self.url}: run settings are fixed at creation and differ ({detail}); "
                        "use a new run directory or drop the setting"
                    )
            return
        if not create:
            what = "does not exist" if not self.fs.exists(self.root) else "is not a seta_stream run"
            raise RunFormatError(
                f"run directory {self.url} {what} (no {FORMAT_FILE}); expected a directory "
                "created by seta_stream. Create it with seta_stream.RunDir(url, create=True) or "
                "by recording losses into it, or check the path"
            )
        unknown = set(settings or {}) - set(DEFAULT_SETTINGS)
        if unknown:
            raise RunFormatError(f"unknown run setting(s) {sorted(unknown)}; valid: {sorted(DEFAULT_SETTINGS)}")
        self._settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self._version = 2 if new_run_buckets(self._settings) > 1 else 1
        doc = {"format": FORMAT_NAME, "version": self._version, "settings": self._settings}
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            self.publish_json(FORMAT_FILE, doc)
        except OSError as exc:  # PermissionError, NotADirectoryError, read-only file system...
            raise RunFormatError(
                f"run directory {self.url} is not writable ({exc.strerror or exc}); expected a "
                "directory this process can create files in. Fix its permissions or choose "
                "another location"
            ) from exc

    def _read_format(self, fmt_path: str) -> dict[str, Any]:
        try:
            info = json.loads(self.fs.cat_file(fmt_path))
        except (ValueError, UnicodeDecodeError) as exc:
            raise RunFormatError(f"{fmt_path}: not valid JSON ({exc})") from exc
        if not isinstance(info, dict) or info.get("format") != FORMAT_NAME:
            raise RunFormatError(
                f"{fmt_path}: format {info.get('format') if isinstance(info, dict) else info!r}, "
                f"expected {FORMAT_NAME!r}; this directory was not written by seta_stream"
            )
        version = info.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise RunFormatError(
                f"{fmt_path}: format version {version!r} is newer than this seta_stream "
                f"understands (<= {FORMAT_VERSION}); upgrade seta_stream to read this run"
            )
        return info

    @property
    def version(self) -> int:
        """The run's format version: 1 (one bucket) or 2 (partitioned)."""
        return self._version

    @property
    def buckets(self) -> int:
        """The number of buckets of the loss table and plans (fixed when the run is created)."""
        return 1 if self._version < 2 else bucket_count(self.settings)

    @property
    def settings(self) -> dict[str, Any]:
        """Run-level settings (``shard_depth``, ``ema_beta2``, ``dataset_size``)."""
        assert self._settings is not None
        return dict(self._settings)

    # ------------------------------------------------------------------ paths
    def path(self, *parts: str) -> str:
        """Absolute storage path (in ``self.fs``) of a path relative to the run directory."""
        rel = "/".join(p.strip("/") for p in parts if p)
        return f"{self.root}/{rel}" if rel else self.root

    def rel(self, path: str) -> str:
        """Path relative to the run directory of an absolute storage path."""
        prefix = self.root + "/"
        return path[len(prefix) :] if path.startswith(prefix) else path

    def display(self, *parts: str) -> str:
        """Path for messages: the URL the user gave joined with ``parts``."""
        rel = "/".join(p.strip("/") for p in parts if p)
        return f"{self.url.rstrip('/')}/{rel}" if rel else self.url

    def local_path(self, *parts: str) -> str | None:
        """Local filesystem path (for memory-mapping), or None for remote storage."""
        return self.path(*parts) if self.is_local else None

    def exists(self, *parts: str) -> bool:
        return bool(self.fs.exists(self.path(*parts)))

    def glob(self, pattern: str) -> list[str]:
        """Sorted relative paths matching a glob relative to the run directory."""
        return sorted(self.rel(p) for p in self.fs.glob(self.path(pattern)))

    def makedirs(self, *parts: str) -> None:
        self.fs.makedirs(self.path(*parts), exist_ok=True)

    # ------------------------------------------------------------------ reading
    def read_bytes(self, *parts: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(*parts)))

    def read_json(self, *parts: str, default: Any = None) -> Any:
        path = self.path(*parts)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return default
        try:
            return json.loads(data)
        except ValueError as exc:
            raise RunFormatError(f"{self.display(*parts)}: not valid JSON ({exc})") from exc

    def read_parquet(self, *parts: str, columns: list[str] | None = None, **options: Any) -> pa.Table:
        """A Parquet file, or a Parquet folder written by :meth:`publish_parquet_parts` (its
        parts in name order, which is row order)."""
        files = self.parquet_files(*parts)
        if not files:
            raise RunFormatError(
                f"{self.display(*parts)}: a folder without Parquet parts; expected the "
                "part-*.parquet files seta_stream writes there. The write was interrupted: "
                "make the file again (for a plan: plan_epoch(..., force=True))"
            )
        if len(files) == 1 and files[0] == self.path(*parts):
            return self._read_parquet_file(files[0], columns, options)
        return pa.concat_tables(self._read_parquet_file(f, columns, options) for f in files)

    def parquet_files(self, *parts: str) -> list[str]:
        """The files of a Parquet file or folder (:meth:`publish_parquet_parts`): the file
        itself, or the folder's parts in name order (which is row order)."""
        path = self.path(*parts)
        if not self.fs.isdir(path):
            return [path]
        return sorted(
            f
            for f in self.fs.ls(path, detail=False)
            if f.endswith(".parquet") and not f.rsplit("/", 1)[-1].startswith((".", "_"))
        )

    def parquet_rows(self, *parts: str) -> int:
        """Rows of a Parquet file or folder, from the files' footers."""
        return sum(self.parquet_footer(f).num_rows for f in self.parquet_files(*parts))

    def parquet_footer(self, path: str) -> pq.FileMetaData:
        """The footer of the Parquet file at ``path`` (a path of this run directory's file
        system, as :meth:`path` gives): rows, row groups, schema and its metadata."""
        if self.is_local:
            return pq.read_metadata(path)
        with self.fs.open(path, "rb") as fh:
            return pq.ParquetFile(fh).metadata

    def _read_parquet_file(self, path: str, columns: list[str] | None, options: dict[str, Any]) -> pa.Table:
        if self.is_local:
            return pq.read_table(path, columns=columns, memory_map=True, **options)
        with self.fs.open(path, "rb") as fh:
            return pq.read_table(fh, columns=columns, **options)

    def read_arrow(self, *parts: str) -> pa.Table:
        """An Arrow IPC file, memory-mapped when local (zero-copy: pages are read on use)."""
        local = self.local_path(*parts)
        if local is not None:
            return pa.ipc.open_file(pa.memory_map(local, "r")).read_all()
        return pa.ipc.open_file(pa.BufferReader(self.read_bytes(*parts))).read_all()

    def open(self, *parts: str, mode: str = "rb") -> Any:
        return self.fs.open(self.path(*parts), mode)

    # ------------------------------------------------------------------ publishing
    def publish_bytes(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` atomically (temp + rename locally; one PUT remotely)."""
        path = self.path(rel)
        if self.is_local:
            tmp = _temp_beside(path)
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        else:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data)

    def publish_json(self, rel: str, obj: Any) -> None:
        self.publish_bytes(rel, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())

    def publish_parquet(self, rel: str, table: pa.Table, **write_options: Any) -> None:
        """Write a Parquet file atomically (streams to a temp file locally)."""
        write_options.setdefault("compression", "zstd")
        path = self.path(rel)
        if not self.is_local:
            buf = io.BytesIO()
            pq.write_table(table, buf, **write_options)
            self.publish_bytes(rel, buf.getvalue())
            return
        tmp = _temp_beside(path)
        try:
            pq.write_table(table, tmp, **write_options)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def publish_parquet_parts(self, rel: str, table: pa.Table, *, part_rows: int, **write_options: Any) -> None:
        """Write ``table`` as a Parquet folder ``rel`` (see :meth:`prepare_parquet_parts`) and
        publish it."""
        self.prepare_parquet_parts(rel, table, part_rows=part_rows, **write_options).commit()

    def prepare_parquet_parts(
        self, rel: str, table: pa.Table, *, part_rows: int, workers: int | None = None, **write_options: Any
    ) -> PendingFile:
        """Write ``table`` as a Parquet folder that appears at ``rel`` only on ``commit()``:
        ``part-00000.parquet``, ``part-00001.parquet``... of ``part_rows`` rows each (the last
        one shorter), in row order, and at least one part (an empty table keeps its schema).
        pyarrow and polars read the folder as one table; duckdb reads ``rel/*.parquet``.

        The parts are encoded on ``workers`` threads (default: the CPUs this process may run
        on; pyarrow releases the GIL while encoding). Locally they go into a temporary folder
        that replaces ``rel`` (file or folder) on commit; remotely they are encoded in memory,
        and commit removes ``rel`` and PUTs the parts one by one. An error, or ``discard()``,
        leaves ``rel`` as it was.
        """
        if part_rows < 1:
            raise InvalidInputError(f"part_rows must be >= 1, got {part_rows}")
        write_options.setdefault("compression", "zstd")
        slices = [table.slice(o, part_rows) for o in range(0, max(table.num_rows, 1), part_rows)]
        width = max(5, len(str(len(slices) - 1)))  # name order stays row order
        names = [f"part-{i:0{width}d}.parquet" for i in range(len(slices))]
        n_threads = max(1, min(len(slices), workers or _usable_cpus()))
        if self.is_local:
            tmp = _temp_beside(self.path(rel))
            os.mkdir(tmp)
            try:
                _write_parts(slices, [f"{tmp}/{name}" for name in names], n_threads, write_options)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return PendingFile(self, rel, tmp=tmp)
        buffers = [io.BytesIO() for _ in slices]
        _write_parts(slices, buffers, n_threads, write_options)
        return PendingFile(self, rel, parts={name: buf.getvalue() for name, buf in zip(names, buffers)})

    def publish_arrow(self, rel: str, table: pa.Table, *, compression: str | None = None) -> None:
        """Write an Arrow IPC file atomically (uncompressed unless ``compression``, e.g.
        ``"zstd"``, is given: memory-mappable by readers)."""
        self.prepare_arrow(rel, table, compression=compression).commit()

    def prepare_arrow(self, rel: str, table: pa.Table, *, compression: str | None = None) -> PendingFile:
        """Write an Arrow IPC file (uncompressed unless ``compression``) that appears at ``rel``
        only on ``commit()`` (a temporary file locally, bytes in memory remotely); ``discard()``
        drops it."""
        if self.is_local:  # stream straight into the temporary file
            tmp = _temp_beside(self.path(rel))
            try:
                # through a 1 MB buffer: a stage file of 3,000 batches (one a shard) is about
                # 12,000 small writes otherwise, 0.096 s against 0.048 s for 15M rows here
                with pa.OSFile(tmp, "wb") as raw, pa.BufferedOutputStream(raw, buffer_size=_WRITE_BUFFER) as sink:
                    write_arrow(sink, table, compression=compression)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            return PendingFile(self, rel, tmp=tmp)
        sink = pa.BufferOutputStream()
        write_arrow(sink, table, compression=compression)
        return PendingFile(self, rel, data=sink.getvalue().to_pybytes())

    def prepare_local(self, rel: str, *, folder: bool = False) -> PendingFile:
        """A local temporary file (or, with ``folder``, an empty folder) at ``.local`` to write
        ``rel``'s content into, for content written piece by piece that need not fit in
        memory. ``commit()`` publishes it at ``rel``: an atomic rename locally (a folder
        replaces the old one), an upload (a folder file by file, in name order, after removing
        the old one) to other storage; ``discard()`` drops it."""
        if self.is_local:
            tmp = _temp_beside(self.path(rel))
        else:
            tmp = os.path.join(tempfile.mkdtemp(prefix="seta-stream-"), rel.rsplit("/", 1)[-1])
        if folder:
            os.mkdir(tmp)
        return PendingFile(self, rel, tmp=tmp)

    def move(self, src_rel: str, dst_rel: str) -> None:
        """Move a file inside the run (used to set corrupt parts aside)."""
        dst = self.path(dst_rel)
        self.fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(self.path(src_rel), dst)

    def remove(self, rel: str) -> None:
        """Remove the file or folder ``rel`` (nothing to do if it is gone)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(rel), recursive=True)

    # ------------------------------------------------------------------ locks
    @contextlib.contextmanager
    def lock(self, name: str, *, wait: float = 0.0, poll: float = 0.2) -> Iterator[None]:
        """Hold ``locks/<name>.lock`` for the duration of the block.

        Another live holder makes this wait up to ``wait`` seconds, then raise
        :class:`RunLockedError` naming the holder. A lock left by a process that died on
        this host (kill -9) is detected by its pid and broken. On remote storage the lock is
        best effort (create-if-absent is not atomic on every object store); the table
        manifest's generation check still prevents a lost update.
        """
        rel = lock_file(name)
        token = uuid.uuid4().hex
        me = {"pid": os.getpid(), "host": socket.gethostname(), "token": token, "time": time.time()}
        deadline = time.monotonic() + wait
        while True:
            if self._try_acquire(rel, me):
                break
            try:
                holder = self.read_json(rel, default=None)
            except RunFormatError:  # half-written by a holder that died: lock files appear whole
                self.remove(rel)
                continue
            if holder is None:  # released since: try again
                continue
            if self._is_stale(holder):
                self.remove(rel)
                continue
            if time.monotonic() >= deadline:
                raise RunLockedError(
                    f"{self.display(rel)} is held by pid {holder.get('pid')} on host "
                    f"{holder.get('host')!r} since {time.ctime(holder.get('time', 0))}; expected "
                    f"no other {name} running on this run. Wait for it to finish, or pass a "
                    "longer wait; if that process is gone from another host, delete the lock file"
                )
            time.sleep(poll)
        try:
            yield
        finally:
            current = self.read_json(rel, default=None) or {}
            if current.get("token") == token:
                self.remove(rel)

    def _try_acquire(self, rel: str, me: dict[str, Any]) -> bool:
        """Create the lock file with ``me`` in it unless it exists. Locally the file appears
        whole: written under a temporary name, then hard-linked to its name (atomic, and
        refused if the name exists). Created empty and then written, as before, another process
        could read it empty in between and take it for a lock left by a dead process
        (tests/test_table.py, two compactions at once)."""
        data = json.dumps(me).encode()
        if self.is_local:
            path = self.path(rel)
            tmp = _temp_beside(path)
            with open(tmp, "wb") as fh:
                fh.write(data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError:  # a file system without hard links: create, then write
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            finally:
                os.unlink(tmp)
            return True
        if self.exists(rel):
            return False
        self.publish_bytes(rel, data)
        return bool((self.read_json(rel, default={}) or {}).get("token") == me["token"])

    @staticmethod
    def _is_stale(holder: dict[str, Any]) -> bool:
        if not holder:
            return True  # lock file vanished or is empty/partial
        if holder.get("host") != socket.gethostname():
            return False
        pid = holder.get("pid")
        if not isinstance(pid, int):
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def write_arrow(sink: Any, table: pa.Table, *, compression: str | None = None) -> None:
    """``table`` as an Arrow IPC file into ``sink``, one record batch per chunk of the table
    (uncompressed unless ``compression``: memory-mappable by readers)."""
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)


#: Bytes :meth:`RunDir.prepare_arrow` gathers before each write to a local file.
_WRITE_BUFFER = 1 << 20


def _temp_beside(path: str) -> str:
    """A fresh temporary name in the (created) folder of local ``path``: ``.tmp-<uuid>-<name>``
    (docs/format.md: files starting with ``.tmp-`` are ignored)."""
    parent, name = path.rsplit("/", 1)
    os.makedirs(parent, exist_ok=True)
    return f"{parent}/.tmp-{uuid.uuid4().hex}-{name}"


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _write_parts(parts: list[pa.Table], sinks: list[Any], threads: int, options: dict[str, Any]) -> None:
    """Write ``parts[i]`` as Parquet to ``sinks[i]`` on ``threads`` worker threads; re-raise
    the first error once every started write has ended."""
    pool = ThreadPoolExecutor(threads)
    try:
        for future in [pool.submit(pq.write_table, part, sink, **options) for part, sink in zip(parts, sinks)]:
            future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _replace_with(tmp: str, path: str) -> None:
    """Rename the folder ``tmp`` to ``path``, replacing the file or folder there. A folder
    cannot be renamed over a non-empty one, so an old ``path`` is first renamed aside and
    removed afterwards (put back if the second rename fails)."""
    old = None
    if os.path.lexists(path):
        old = _temp_beside(path)
        os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        if old is not None:
            os.rename(old, path)
        raise
    if old is not None:
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)


class PendingFile:
    """A file (or Parquet parts folder) written by a ``prepare_*`` method of :class:`RunDir`,
    not yet visible at its path: ``commit()`` publishes it, ``discard()`` drops it."""

    def __init__(
        self,
        run: RunDir,
        rel: str,
        *,
        tmp: str | None = None,
        data: bytes | None = None,
        parts: dict[str, bytes] | None = None,
    ) -> None:
        self.run, self.rel, self._tmp, self._data, self._parts = run, rel, tmp, data, parts

    @property
    def local(self) -> str:
        """The local temporary file or folder (of :meth:`RunDir.prepare_local`)."""
        assert self._tmp is not None
        return self._tmp

    def commit(self) -> None:
        """Make it visible at its path (an atomic rename locally, PUTs remotely)."""
        if self._tmp is not None and not self.run.is_local:
            tmp, self._tmp = self._tmp, None
            try:
                self.run.remove(self.rel)
                if os.path.isdir(tmp):
                    for name in sorted(os.listdir(tmp)):
                        self.run.fs.put_file(f"{tmp}/{name}", self.run.path(f"{self.rel}/{name}"))
                else:
                    self.run.fs.put_file(tmp, self.run.path(self.rel))
            finally:
                shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
        elif self._tmp is not None:
            tmp, self._tmp = self._tmp, None
            try:
                if os.path.isdir(tmp):
                    _replace_with(tmp, self.run.path(self.rel))
                else:
                    os.replace(tmp, self.run.path(self.rel))
            finally:
                if os.path.isdir(tmp):
                    shutil.rmtree(tmp, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
        elif self._data is not None:
            data, self._data = self._data, None
            self.run.publish_bytes(self.rel, data)
        elif self._parts is not None:
            parts, self._parts = self._parts, None
            self.run.remove(self.rel)
            for name, data in parts.items():
                self.run.publish_bytes(f"{self.rel}/{name}", data)

    def discard(self) -> None:
        """Drop it without publishing it."""
        if self._tmp is not None and not self.run.is_local:
            shutil.rmtree(os.path.dirname(self._tmp), ignore_errors=True)
        elif self._tmp is not None:
            if os.path.isdir(self._tmp):
                shutil.rmtree(self._tmp, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._tmp)
        self._tmp = self._data = self._parts = None


def _reopen(url: str, storage_options: dict[str, Any]) -> RunDir:
    return RunDir(url, create=False, storage_options=storage_options)

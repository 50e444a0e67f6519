"""Engines: where the per-bucket work of a partitioned compaction or plan runs.

* ``"local"`` (default): in this process, one bucket after the other (a partitioned plan maps
  its buckets two at a time on threads of this process: :class:`ThreadEngine`).
* ``"ray"``: as Ray tasks on the cluster ``ray.init`` reaches (``pip install
  seta-stream[ray]``; ``address`` as ``ray.init`` takes it: None starts or joins a local
  cluster, ``"auto"`` or ``"ray://host:10001"`` joins one). Every node must reach the run
  directory at the same path (a shared filesystem), because tasks read and write the buckets'
  files there (the table's bucket files, a plan's per-bucket files). The driver (the process
  calling ``compact`` or ``plan_epoch``) merges the small per-bucket statistics and publishes
  the manifest or the plan, exactly once.

An engine maps a function over items in order: :meth:`map` yields ``fn(item)`` for each item,
in the items' order (Ray runs them in parallel; results are fetched one at a time, so the
driver holds one bucket's result at a time).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import Any

from ..errors import InvalidInputError

__all__ = ["ENGINES", "Engine", "LocalEngine", "RayEngine", "ThreadEngine", "get_engine"]

ENGINES = ("local", "ray")


class Engine:
    """Runs ``fn`` over items; the local engine, in this process."""

    name = "local"

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        return (fn(item) for item in items)

    def check_run(self, run: Any, work: str, files: str) -> None:
        """Raise InvalidInputError if this engine's tasks cannot reach ``run``'s files
        (``work``: "compact" or "plan"; ``files``: what the tasks write there). This process
        reaches any run directory."""


LocalEngine = Engine


class ThreadEngine(Engine):
    """The local engine on ``workers`` threads of this process: ``fn`` runs on up to ``workers``
    items at once, and an item is started only once the caller is done with all but
    ``workers - 1`` of the results before it, so at most ``workers`` results (the one the
    caller holds and the ones being made) are alive at a time, as with one bucket at a time
    and ``workers`` = 1. Results come in the items' order.

    Why: a partitioned plan's passes are NumPy kernels, Parquet decoding and file writes that
    release the GIL; one bucket at a time left the other core idle for most of a plan
    (docs/benchmarks.md, "Web scale")."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, int(workers))

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        if self.workers == 1:
            yield from super().map(fn, items)
            return
        todo = iter(items)
        pending: deque[Future[Any]] = deque()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="seta-stream-bucket") as pool:
            try:
                pending.extend(pool.submit(fn, item) for item in islice(todo, self.workers))
                while pending:
                    result = pending.popleft().result()
                    yield result
                    del result
                    # the next item, once the caller is done with this result
                    pending.extend(pool.submit(fn, item) for item in islice(todo, 1))
            finally:  # an error or a caller that stops: nothing more starts, the running ones finish
                for future in pending:
                    future.cancel()


def _call(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


class RayEngine(Engine):
    """Runs ``fn`` over items as Ray tasks (one task per item, one CPU each)."""

    name = "ray"

    def __init__(self, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:  # pragma: no cover - depends on the installed extras
            raise InvalidInputError(
                "engine='ray' needs Ray, which is not installed; install it with "
                "pip install 'seta-stream[ray]' (or use engine='local')"
            ) from None
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
        self._task = ray.remote(_call)

    def check_run(self, run: Any, work: str, files: str) -> None:
        """Tasks on other nodes reach the run directory only on a filesystem they all mount."""
        if not run.is_local:
            raise InvalidInputError(
                f"engine='ray' needs the run directory on a filesystem every node mounts (the tasks write "
                f"{files} there); {run.url} is not a local path. {work.capitalize()} with engine='local', "
                "or put the run directory on shared storage"
            )

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        fn_ref = self._ray.put(fn)  # serialised once for all tasks
        refs = [self._task.remote(fn_ref, item) for item in items]
        return (self._ray.get(ref) for ref in refs)


def get_engine(engine: str | Engine | None, address: str | None = None) -> Engine:
    """The engine named ``engine`` ("local", "ray") or ``engine`` itself."""
    if isinstance(engine, Engine):
        return engine
    if engine in (None, "local"):
        if address is not None:
            raise InvalidInputError(f"ray_address={address!r} given with engine='local'; pass engine='ray'")
        return Engine()
    if engine == "ray":
        return RayEngine(address)
    raise InvalidInputError(f"engine={engine!r}; expected one of {list(ENGINES)}")

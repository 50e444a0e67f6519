"""The local engine on threads (``ThreadEngine``), which a local partitioned plan maps its
buckets with: results in the items' order, at most ``workers`` results alive at once, an error
raised where the results are read and nothing started after it."""

from __future__ import annotations

import threading
import time

import pytest

from seta_stream._kernels.engine import ThreadEngine


class _Tracked:
    """A result that counts how many of its kind are alive."""

    alive = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, item: int) -> None:
        self.item = item
        with _Tracked.lock:
            _Tracked.alive += 1
            _Tracked.most = max(_Tracked.most, _Tracked.alive)

    def __del__(self) -> None:
        with _Tracked.lock:
            _Tracked.alive -= 1


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_come_in_order_and_at_most_workers_are_alive(workers):
    _Tracked.alive = _Tracked.most = 0
    started, threads = [], set()

    def make(item):
        started.append(item)
        threads.add(threading.current_thread().name)
        time.sleep(0.02 * (item % 3))  # later items may finish first
        return _Tracked(item)

    seen = []
    for result in ThreadEngine(workers).map(make, range(9)):
        seen.append(result.item)
        time.sleep(0.01)  # the caller works on the result while the next ones are made
        del result
    assert seen == list(range(9))
    assert sorted(started) == list(range(9))
    assert _Tracked.most == workers
    assert _Tracked.alive == 0
    if workers > 1:
        assert all(name.startswith("seta-stream-bucket") for name in threads) and len(threads) == workers


def test_an_error_is_raised_in_order_and_nothing_starts_after_it():
    started = []

    def make(item):
        started.append(item)
        if item == 2:
            raise ValueError("bucket 2 failed")
        return item

    seen = []
    with pytest.raises(ValueError, match="^bucket 2 failed$"):
        for result in ThreadEngine(2).map(make, range(10)):
            seen.append(result)
    assert seen == [0, 1]
    # item 3 is submitted once the caller is done with item 1 (and cancelled by the error if it
    # has not started yet); no later one
    assert {0, 1, 2} <= set(started) <= {0, 1, 2, 3}


def test_a_caller_that_stops_early_leaves_no_item_running():
    started = []
    gen = ThreadEngine(2).map(lambda item: started.append(item) or item, range(100))
    assert next(gen) == 0
    gen.close()  # the pool is shut down: the item in flight finishes or is cancelled, nothing else starts
    after = sorted(started)
    time.sleep(0.05)
    assert after == sorted(started) and after in ([0], [0, 1])

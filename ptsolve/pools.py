"""Process pools that never outlive their caller: the solves of a search, of an issue order's pins, of a suite."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any


def terminate(pool: ProcessPoolExecutor) -> None:
    """End a pool's workers now (``shutdown`` waits for running solves, up to their time limit)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API lists them
    for pr in procs:
        pr.terminate()
    for pr in procs:
        pr.join(5)


def unordered(fn: Callable[..., Any], calls: Sequence[tuple], jobs: int) -> Iterator[tuple[int, Any]]:
    """(index, ``fn(*calls[index])``) as each finishes, on ``jobs`` worker processes (in this process when ``jobs``
    is 1 or there is one call). SIGINT or an error ends the workers before it propagates."""
    if jobs <= 1 or len(calls) <= 1:
        for i, args in enumerate(calls):
            yield i, fn(*args)
        return
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(calls)))
    try:
        futs = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
        left = set(futs)
        while left:
            done, left = wait(left, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=futs.__getitem__):
                yield futs[f], f.result()
    except BaseException:
        terminate(pool)
        raise
    finally:
        pool.shutdown(cancel_futures=True)

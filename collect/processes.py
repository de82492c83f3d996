"""Jobs N at a time in spawned processes, each with its share of the cores as torch threads.

Why processes: a locally served tiny planner's generation is mostly Python overhead on one core (docs/training.md
"Two planners at a time in the eval"): two 1-thread processes side by side generate ~1.4x what one 2-thread process
does. Used by serve.eval (the planners, `planner_processes`) and collect.relabel (the student's run in task shards,
`processes`). Spawned, not forked: the parent holds torch, tokenizers and server threads.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
from collections.abc import Callable

from collect.config import usable_cores

log = logging.getLogger(__name__)


def parse_processes(value, what: str = "processes") -> int | str:
    """An integer >= 1 (or its digits) or 'auto'; `what` names the setting in the error."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == "auto" or (type(value) is int and value >= 1):
        return value
    raise ValueError(f"{what}: expected an integer >= 1 or 'auto', got {value!r}")


def resolve_processes(value: int | str, jobs: int) -> int:
    """'auto' -> the usable cores; never more processes than jobs; at least 1."""
    n = usable_cores() if value == "auto" else int(value)
    return max(1, min(jobs, n))


def threads_per_process(n: int) -> int:
    """torch threads for each of n processes sharing this process's cores."""
    return max(1, usable_cores() // n)


def run_spawned(
    fn: Callable,
    jobs: dict[str, tuple],
    n: int,
    what: str = "job",
    on_done: Callable[[str, object, int, int], None] | None = None,
) -> tuple[dict[str, object], list[tuple[str, BaseException]]]:
    """fn(*args) for every job, n at a time in spawned processes, submitted in `jobs` order (each free process takes
    the next). A failing job does not stop the others: returns (results by job name, [(name, error), ...]);
    `on_done(name, result, finished, total)` is called as each succeeds. Ctrl-C cancels what has not started."""
    ctx = multiprocessing.get_context("spawn")
    done: dict[str, object] = {}
    errors: list[tuple[str, BaseException]] = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        futs = {pool.submit(fn, *args): name for name, args in jobs.items()}
        try:
            for fut in concurrent.futures.as_completed(futs):
                name = futs[fut]
                try:
                    done[name] = fut.result()
                except Exception as e:  # noqa: BLE001 - returned to the caller, after the other jobs finish
                    errors.append((name, e))
                    log.error("%s %s failed: %s", what, name, e)
                    continue
                if on_done is not None:
                    on_done(name, done[name], len(done) + len(errors), len(futs))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return done, errors


def raise_first(errors: list[tuple[str, BaseException]], what: str, kinds: tuple[type[Exception], ...] = ()) -> None:
    """Raise the first failure of run_spawned with its job named, as its own type when it is one of `kinds` (the
    types a CLI reports as a clear error), else RuntimeError; nothing when there was none."""
    if not errors:
        return
    name, e = errors[0]
    more = f" (and {len(errors) - 1} more {what}(s) failed: see the log)" if len(errors) > 1 else ""
    kind = next((k for k in (*kinds, FileNotFoundError, ValueError) if isinstance(e, k)), RuntimeError)
    raise kind(f"{what} {name}: {type(e).__name__}: {e}{more}") from e

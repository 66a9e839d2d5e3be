"""Run a function on N local ranks of one gloo group (spawned processes, one torch thread each).

For tests and benchmarks of the multi-rank code (dso/sharded_*.py, neurons/ranks.py) without torchrun:
:func:`run_ranks` starts ``world`` fresh interpreters with torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_PORT``: a store the caller serves, as torchrun's agent does;
forked from a server that has imported torch, :func:`preloaded_context`), calls ``fn(*args)`` in each and
returns every rank's result in rank order.  A rank still running after ``timeout`` seconds prints its
stack and ends.  ``fn`` must be importable (a module-level function) and its
result picklable (our own processes, our own data).  A rank that raises fails the whole call with its
traceback; a group that does not finish within ``timeout`` seconds is killed.
"""
from __future__ import annotations

import faulthandler
import multiprocessing
import os
import queue
import traceback
from collections.abc import Callable
from typing import Any


def _rank_main(fn: Callable[..., Any], args: tuple[Any, ...], env: dict[str, str], results: Any,
               timeout: float) -> None:
    os.environ.update(env)
    faulthandler.dump_traceback_later(timeout, exit=True)  # a rank stuck in a collective shows where, then ends
    import torch
    torch.set_num_threads(1)
    rank = int(env["RANK"])
    try:
        results.put((rank, True, fn(*args)))
    except BaseException:  # noqa: BLE001 — reported to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


# what every worker imports anyway: the fork server imports it once, each worker forked from it skips ~3 s of CPU
PRELOAD = ["torch", "torch.distributed", "dso.nn.model", "dso.training.inner"]


def preloaded_context() -> multiprocessing.context.ForkServerContext:
    """Workers forked from a server interpreter that has imported torch and nothing else of its parent's.

    A worker starts in about a tenth of a second instead of the ~3 s of CPU a spawned interpreter spends
    importing torch, and still shares no state with the process that asked for it (the server is a fresh
    interpreter that runs no torch code before it forks, so no thread pool is copied)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 600.0) -> list[Any]:
    """``fn(*args)`` on ranks 0 … world−1 of one group; their results in rank order."""
    import torch.distributed as dist

    # the group's store is served from here on a port the kernel picks, and the ranks connect to it (torch's
    # TORCHELASTIC_USE_AGENT_STORE, as under torchrun): no free port to look up that another process could take
    # before rank 0 listens on it
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    ctx = preloaded_context()
    results = ctx.Queue()
    procs = []
    for rank in range(world):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1"}
        proc = ctx.Process(target=_rank_main, args=(fn, args, env, results, timeout), daemon=True)
        proc.start()
        procs.append(proc)
    got: dict[int, Any] = {}
    try:
        while len(got) < world:
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(
                    f"ranks {sorted(set(range(world)) - set(got))} did not finish in {timeout:.0f} s") from None
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            got[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return [got[r] for r in range(world)]

"""The dask client every parallel stage uses.

Tasks receive small descriptors (a file path and byte ranges) and return paths and small
statistics, never bulk bytes. ``map_tasks`` is the one place that fans work out, so the
``synchronous`` mode (no dask, everything in this process) exercises exactly the same task code.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterable, Iterator

from pipeline import warmup
from pipeline.config import ClusterConfig

log = logging.getLogger(__name__)


#: Environment of local workers. Arrow's allocator (mimalloc) gives freed memory back to the kernel 10 ms
#: after it is freed, so each task's tables landed on fresh pages again; on VMs whose host backs guest
#: memory lazily a fresh page costs ~2.5 s per GB (measured here). Kept for a second, the next task
#: reuses it: the worker touched 543 -> 307-340 MB of fresh pages decoding a 1 GB trace. (Never purging,
#: -1, did as well, but then ``release_unused`` could no longer empty the pool of an idle worker.)
WORKER_ENV = {"MIMALLOC_PURGE_DELAY": "1000"}


class Pool:
    """Runs task functions either on a dask cluster or inline."""

    def __init__(self, client=None, warming: bool = False):
        self.client = client
        #: The workers are warming up (a local cluster): the first ``map`` waits for them (``warmup.ready``).
        self._warming = warming

    @property
    def n_workers(self) -> int:
        if self.client is None:
            return 1
        return max(1, len(self.client.scheduler_info().get("workers", {})))

    def set_aside(self) -> None:
        """With a cluster: the objects that exist now (a stage's own imports, made after the cluster started:
        DuckDB, the numba kernels the client runs) also stay out of the garbage collector's full
        collections until the cluster closes (see ``_gc_set_aside``)."""
        if self.client is not None:
            import gc

            gc.freeze()

    def map(self, fn: Callable[..., Any], items: Iterable[Any], on_result: Callable[[Any], None] | None = None,
            **kwargs) -> list[Any]:
        """``[fn(item, **kwargs) for item in items]``, in order, on the cluster when there is one.
        ``on_result(result)`` runs in this process for each result as soon as it arrives (in the order they
        finish), before the list is returned: it may take what it needs out of a result."""
        items = list(items)
        if self.client is None or not items:
            results = []
            for item in items:
                results.append(fn(item, **kwargs))
                if on_result is not None:
                    on_result(results[-1])
            return results
        if self._warming:
            self._warming = False
            late = [w for w, done in self.client.run(warmup.ready).items() if not done]
            if late:
                log.warning("worker warm-up still running after %.0f s on %s", warmup.READY_TIMEOUT_S, ", ".join(late))
        futures = self.client.map(fn, items, pure=False, **kwargs)
        if on_result is None:
            return self.client.gather(futures)
        from distributed import as_completed

        done: dict[Any, Any] = {}
        for future, result in as_completed(futures, with_results=True):
            on_result(result)
            done[future.key] = result
        return [done[f.key] for f in futures]


@contextlib.contextmanager
def connect(cfg: ClusterConfig | None = None, warm_up: Iterable[str] = ()) -> Iterator[Pool]:
    """A Pool for the configured cluster: a LocalCluster on 127.0.0.1, a remote scheduler, or inline.

    ``warm_up``: modules (the stages' ``WARM_UP``) that each local worker imports, with their compiled
    kernels, on a thread as soon as it starts (:mod:`pipeline.warmup`); the pool's first ``map`` waits
    until they have all done so, so that no task shares a worker with its warm-up."""
    cfg = cfg or ClusterConfig()
    warm_up = list(warm_up)
    if cfg.mode == "synchronous":
        yield Pool(None)
        return
    from distributed import Client, LocalCluster

    # distributed logs every scheduler/nanny step at INFO on its own handler; keep the CLI quiet
    # unless -vv asked for debug output.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("distributed").setLevel(logging.WARNING)

    if cfg.mode == "address":
        if not cfg.address:
            from pipeline.errors import ConfigError

            raise ConfigError("cluster.address: required when cluster.mode is 'address'")
        from distributed.comm import get_address_host_port

        from pipeline.errors import ConfigError

        try:
            # (checked before a Client exists: one that fails to start leaves its event loop behind)
            get_address_host_port(cfg.address)
            client = Client(cfg.address, timeout="30s")
        except (OSError, ValueError) as exc:     # (not an address, unreachable, timed out)
            raise ConfigError(f"cluster.address {cfg.address!r}: cannot connect to a dask scheduler: {exc}") from None
        with client:
            yield Pool(client)
        return
    n = cfg.n_workers or os.cpu_count() or 1
    with LocalCluster(
        n_workers=n,
        threads_per_worker=cfg.threads_per_worker,
        processes=True,
        host="127.0.0.1",
        # The scheduler serves HTTP (health, metrics) even without a dashboard: a free loopback port
        # keeps clusters that run side by side from fighting over :8787.
        dashboard_address="127.0.0.1:0",
        memory_limit=cfg.memory_limit,
        silence_logs=40,
        preload=["pipeline.warmup"],
        env={warmup.ENV: ",".join(warm_up), **WORKER_ENV},
    ) as cluster, Client(cluster) as client, _gc_set_aside():
        yield Pool(client, warming=bool(warm_up))


@contextlib.contextmanager
def _gc_set_aside():
    """While the cluster runs, the objects that exist once it is up (the imports of numpy, pyarrow,
    duckdb, dask: about a million) are kept out of the garbage collector's full collections, which
    otherwise scanned them again and again as the scheduler allocated (about 4 % of a decode's CPU in the
    client process). Given back at the end, so shutdown finalizes them as usual."""
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

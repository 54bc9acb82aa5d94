"""The pool every parallel stage hands its tasks to: a dask client, or this process.

Tasks receive small descriptors (a file path and byte ranges) and return paths and small
statistics, never bulk bytes. ``map_tasks`` is the one place that fans work out, so the
``synchronous`` mode (no dask, everything in this process) exercises exactly the same task code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from pipeline.cluster import forkserver, gcpolicy, warmup

if TYPE_CHECKING:
    from pipeline.config import ClusterConfig

log = logging.getLogger(__name__)


class Pool:
    """Runs task functions either on a dask cluster or inline."""

    def __init__(self, client=None, warming: bool = False, start: Callable[[], "Pool"] | None = None,
                 eager: bool = False, remote: str | None = None):
        self._client = client
        #: The scheduler's address when the workers may be on other machines (``cluster.mode: address``).
        self._remote = remote
        self._shared: set[str] = set()          # (directories they were found to see: ``require_shared``)
        #: The cluster is starting already (``connect(background=True)``), not when first needed.
        self._eager = eager
        #: The workers are warming up (a local cluster): the first ``map`` waits for them (``warmup.ready``).
        self._warming = warming
        #: Starts the cluster when it is first needed (``connect(lazy=True)``); returns the started Pool.
        self._start = start
        self._starting = threading.Lock()       # (two stages of a job may use one pool at once)

    @property
    def client(self):
        """The dask client (None: tasks run inline); a lazy pool starts its cluster here, once."""
        if self._start is not None:
            with self._starting:
                if self._start is not None:
                    started = self._start()        # (a start that fails is tried again, never taken for inline)
                    self._client, self._warming, self._remote = started._client, started._warming, started._remote
                    self._start = None
        return self._client

    @property
    def started(self) -> bool:
        """Whether the pool has a cluster now (a lazy one only once a task or the worker count needed it)."""
        return self._client is not None

    @property
    def n_workers(self) -> int:
        if self.client is None:
            return 1
        return max(1, len(self.client.scheduler_info().get("workers", {})))

    def ready(self) -> None:
        """Wait for a cluster that is starting (``connect(background=True)``); a lazy pool stays unstarted."""
        if self._eager:
            self.client

    def set_aside(self) -> None:
        """With a cluster: the objects that exist now (a stage's own imports, made after the cluster started:
        DuckDB, the numba kernels the client runs) also stay out of the garbage collector's full
        collections until the cluster closes (:func:`pipeline.cluster.gcpolicy.set_aside_now`)."""
        if self._client is not None or self._eager:   # (a lazy pool that has no cluster yet may never need one)
            gcpolicy.set_aside_now()

    def require_shared(self, directory, what: str) -> None:
        """With workers that may be on other machines (``cluster.mode: address``): unless each of them sees
        ``directory`` as this process does (a file made there now, looked for by every worker), a ConfigError that
        names the directory, the workers and ``what`` puts it on a filesystem they share. Once per directory."""
        import uuid
        from pathlib import Path

        if str(directory) in self._shared or self.client is None or self._remote is None:
            return          # (self.client first: a lazy pool knows where its workers are once it has started)
        probe = Path(directory) / f".bootprof-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        try:
            seen = self.client.run(os.path.isfile, str(probe))
        finally:
            probe.unlink(missing_ok=True)
        blind = sorted(w for w, ok in seen.items() if not ok)
        if blind:
            from pipeline.errors import ConfigError

            raise ConfigError(
                f"{directory}: {len(blind)} of the {len(seen)} workers of the dask scheduler at {self._remote} do not "
                f"see this directory ({', '.join(blind[:3])}{', ...' if len(blind) > 3 else ''}): workers on other "
                f"machines need {what} on a filesystem they share, at the same path")
        self._shared.add(str(directory))

    def everywhere(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` in this process and, when the pool has started a cluster, in each of its workers (what a
        stage's tasks keep between them, let go of before its output is swapped into place)."""
        fn()
        if self._client is not None:
            self._client.run(fn, on_error="return")     # (a worker that cannot: nothing to undo there)

    def map(self, fn: Callable[..., Any], items: Iterable[Any], on_result: Callable[[Any], None] | None = None,
            **kwargs) -> list[Any]:
        """``[fn(item, **kwargs) for item in items]``, in order, on the cluster when there is one.
        ``on_result(result)`` runs in this process for each result as soon as it arrives (in the order they
        finish), before the list is returned: it may take what it needs out of a result."""
        items = list(items)
        if not items or self.client is None:
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
        # Arguments shared by every task go to the workers once, as data: distributed 2026.8 turns a keyword
        # argument of 64 kB or more into a task of that name that it then fails to send ("Error
        # transitioning 'files'", the self-profile metadata of a build with 88 rustc processes).
        kwargs = {k: v if isinstance(v, (int, float, bool, type(None))) or (isinstance(v, str) and len(v) < 4096)
                  else self.client.scatter([v], broadcast=True, hash=False)[0] for k, v in kwargs.items()}
        futures = self.client.map(fn, items, pure=False, **kwargs)
        if on_result is None:
            return self.client.gather(futures)
        from distributed import as_completed

        done: dict[Any, Any] = {}
        # (this client's loop, named: as_completed would take the current default client's, which on this thread
        # may be another one when this pool's client was made on another thread)
        for future, result in as_completed(futures, loop=self.client.loop, with_results=True):
            on_result(result)
            done[future.key] = result
        return [done[f.key] for f in futures]


def runs_inline(cfg: ClusterConfig, size: int | None) -> bool:
    """Whether inputs of ``size`` bytes run in this process (``cluster.inline_below``, mode 'local' only)."""
    return cfg.mode == "local" and size is not None and size < cfg.inline_below


@contextlib.contextmanager
def connect(cfg: ClusterConfig | None = None, warm_up: Iterable[str] = (), lazy: bool = False,
            size: int | None = None, background: bool = False) -> Iterator[Pool]:
    """A Pool for the configured cluster: a LocalCluster on 127.0.0.1, a remote scheduler, or inline.

    ``warm_up``: modules (the stages' ``WARM_UP``) that local workers have imported, with their compiled
    kernels, before their first task: local workers are forked from one server process that loaded them
    while this cluster started (:func:`pipeline.cluster.forkserver.start`); modules it lacks (it serves every
    cluster of this process) a worker loads on a thread as it starts (:mod:`pipeline.cluster.warmup`). The pool's first ``map``
    waits until every worker has them, so that no task shares a worker with its warm-up.

    ``lazy``: the cluster starts (or the scheduler is connected to) only when the pool first needs it,
    for a stage that may need none: the aggregate and report sections of an ETL trace run in DuckDB and
    Python, and a local cluster that started beside them (its workers forked and warming up on the cores
    DuckDB runs on) made ``bootprof aggregate`` and ``bootprof report`` slower. The cluster ends with the
    context.

    ``background``: a local cluster starts on a thread while the caller goes on (a decode walks the trace's
    buffer headers, opens its output and imports its joins meanwhile); the pool's first use waits for it,
    and ``Pool.ready`` waits for it explicitly.

    ``size``: bytes of the command's inputs; below ``cluster.inline_below`` a local cluster is not started at
    all and tasks run in this process (:func:`runs_inline`)."""
    if cfg is None:
        from pipeline.config import ClusterConfig       # (not at the top: workers import this package)

        cfg = ClusterConfig()
    warm_up = list(warm_up)
    if runs_inline(cfg, size):
        yield Pool(None)
        return
    if lazy and cfg.mode != "synchronous":
        with contextlib.ExitStack() as started:
            yield Pool(start=lambda: started.enter_context(connect(cfg, warm_up)))
        return
    if cfg.mode == "synchronous":
        yield Pool(None)
        return
    if background and cfg.mode == "local":
        # (the imports here, on the caller's thread, beside the fork server's warm-up: the thread only starts
        # the scheduler and waits for the workers, and never imports a module the caller imports too)
        if forkserver.start(warm_up):
            _import(warm_up)
        import distributed  # noqa: F401
        starting = _Starting(cfg, warm_up)
        try:
            yield Pool(start=starting.pool, eager=True)
        finally:
            starting.close()
        return
    # First the fork server, which warms up while this process imports what it runs of the stage (the same
    # modules: a decode's client plans and joins with them) and distributed, and starts the scheduler.
    forked = cfg.mode == "local" and forkserver.start(warm_up)
    if forked:
        _import(warm_up)
    from distributed import Client

    # distributed logs every scheduler/nanny step at INFO on its own handler; keep the CLI quiet
    # unless -vv asked for debug output.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("distributed").setLevel(logging.WARNING)

    if cfg.mode == "address":
        from distributed.comm import get_address_host_port

        from pipeline.errors import ConfigError

        address = cfg.address or _scheduler_file_address(cfg.scheduler_file)
        try:
            # (checked before a Client exists: one that fails to start leaves its event loop behind)
            get_address_host_port(address)
            client = Client(address, timeout="30s")
        except (OSError, ValueError) as exc:     # (not an address, unreachable, timed out)
            raise ConfigError(f"cluster.address {address!r}: cannot connect to a dask scheduler: {exc}") from None
        with client:
            yield Pool(client, remote=address)
        return
    with local_cluster(cfg, warm_up, forked) as cluster, Client(cluster) as client, gcpolicy.set_aside_while():
        yield Pool(client, warming=bool(warm_up))


def _scheduler_file_address(path: str | None) -> str:
    """The address a dask scheduler wrote to its ``--scheduler-file``."""
    import json
    from pathlib import Path

    from pipeline.errors import ConfigError

    if not path:
        raise ConfigError("cluster.address or cluster.scheduler_file: one is required when cluster.mode is 'address'")
    try:
        return str(json.loads(Path(path).expanduser().read_text())["address"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cluster.scheduler_file {path}: no dask scheduler's address there ({exc}); start one "
                          f"with `dask scheduler --scheduler-file {path}`") from None


@contextlib.contextmanager
def local_cluster(cfg: ClusterConfig, warm_up: list[str], forked: bool, **options):
    """The ``LocalCluster`` of mode 'local': ``cfg``'s workers on 127.0.0.1, forked from the fork server when ``forked``
    (:func:`pipeline.cluster.forkserver.start`), each warming up ``warm_up`` as it starts."""
    import dask
    from distributed import LocalCluster

    n = cfg.n_workers or os.cpu_count() or 1
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver" if forked else "spawn"}), LocalCluster(
        n_workers=n,
        threads_per_worker=cfg.threads_per_worker,
        processes=True,
        host="127.0.0.1",
        # The scheduler serves HTTP (health, metrics) even without a dashboard: a free loopback port
        # keeps clusters that run side by side from fighting over :8787.
        dashboard_address="127.0.0.1:0",
        memory_limit=cfg.memory_limit,
        silence_logs=40,
        preload=["pipeline.cluster.warmup"],
        # (a forked worker has the fork server's environment: it gets this process's as it is now, as a
        # spawned one would)
        env={**os.environ, warmup.ENV: ",".join(warm_up), **forkserver.WORKER_ENV},
        **options,
    ) as cluster:
        yield cluster


class _Starting:
    """A local cluster (:func:`connect`) started on a thread of its own, which also ends it: distributed's
    ``Client`` must leave its context on the thread that entered it."""

    def __init__(self, cfg: ClusterConfig, warm_up: list[str]):
        self._cfg, self._warm_up = cfg, warm_up
        self._ready, self._closing = threading.Event(), threading.Event()
        self._pool: Pool | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bootprof-cluster", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with connect(self._cfg, self._warm_up) as pool:
                self._pool = pool
                self._ready.set()
                self._closing.wait()
        except BaseException as exc:      # noqa: BLE001 - handed to the pool's user (pool) or logged (close)
            self._error = exc
        finally:
            self._ready.set()

    def pool(self) -> Pool:
        """The started pool (waits for it; a start that failed raises here, in the caller's thread)."""
        self._ready.wait()
        if self._pool is None:
            error, self._error = self._error, None
            raise error if error is not None else RuntimeError("the local dask cluster did not start")
        return self._pool

    def close(self) -> None:
        """End the cluster (after its start, if it is still starting) and wait for that."""
        self._closing.set()
        self._thread.join()
        if self._error is not None:
            log.warning("the local dask cluster failed: %s", self._error)


def _import(names: list[str]) -> None:
    """Import these modules now (one that fails is left for the stage to import and report)."""
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            log.debug("cannot import %s", name, exc_info=True)


def run_once(name: str, run_dir, config, size: int | None, inputs: list | None = None, eager: bool = False):
    """``bootprof <stage>``: the stage once on ``run_dir``, with a pool sized by ``size`` (the bytes its tasks read:
    below ``cluster.inline_below`` they run in this process). The pool is lazy (a cluster starts only when a task
    needs one) unless ``eager``, for a stage that hands work to it from its start (it then starts beside the
    stage's first steps)."""
    from pipeline import stages

    module = stages.get(name).load()
    with connect(config.cluster, warm_up=stages.warm_up(module), lazy=not eager, background=eager,
                 size=size) as pool:
        return module.run(run_dir, config, pool, inputs=inputs)

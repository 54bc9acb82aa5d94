"""The dask pool (``pipeline/cluster/``: pool, fork server, warm-up, collector policy): real local workers on
127.0.0.1, a running scheduler, lazy and background pools, warm forked workers, signals and exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from pipeline.errors import ConfigError
from tests.conftest import ROOT


def test_address_mode_runs_tasks_on_a_running_scheduler(dask_pool):
    """cluster.mode 'address': the tasks go to the scheduler at that address (the session's cluster)."""
    import os

    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    address = dask_pool.client.scheduler.address
    with connect(ClusterConfig(mode="address", address=address)) as pool:
        assert pool.n_workers == 2
        pids = set(pool.map(_pid, range(8)))
    assert os.getpid() not in pids and pids <= set(dask_pool.client.run(os.getpid).values())


def _pid(_):
    import os

    return os.getpid()


def _square(x, offset=0):
    import os

    return x * x + offset, os.getpid()


def test_pool_runs_tasks_on_real_worker_processes(dask_pool):
    import os

    results = dask_pool.map(_square, range(8), offset=1)
    assert [r[0] for r in results] == [x * x + 1 for x in range(8)]
    assert os.getpid() not in {r[1] for r in results}
    assert dask_pool.n_workers == 2


def _size_of(x, shared):
    return x + sum(len(v["text"]) for v in shared.values())


def test_pool_passes_large_shared_arguments(dask_pool):
    """A keyword argument shared by every task may be large (the metadata of a build's self-profiles): 200 kB
    here, past the 64 kB where distributed would make it a task of its own and fail to send it."""
    shared = {i: {"text": "x" * 2000, "n": i} for i in range(100)}
    assert dask_pool.map(_size_of, [1, 2, 3], shared=shared) == [200_001, 200_002, 200_003]
    assert dask_pool.map(_square, [3], offset="y" * 10_000 and 2)[0][0] == 11


def test_a_lazy_pool_starts_its_cluster_when_a_task_needs_it():
    """``connect(lazy=True)``: no cluster until the first task (or the worker count) needs one; then a real
    one, closed with the context. A bad scheduler address fails at that first need, and again at the next:
    tasks never fall back to running in this process."""
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    with connect(ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB"), lazy=True) as pool:
        pool.set_aside()
        assert pool.map(_square, []) == [] and not pool.started
        results = pool.map(_square, [2, 3])
        assert pool.started and [r[0] for r in results] == [4, 9] and os.getpid() not in {r[1] for r in results}
        assert pool.n_workers == 1
        client = pool.client
    assert client.status == "closed"
    bad = "tcp://127.0.0.1:notaport"
    with connect(ClusterConfig(mode="address", address=bad), lazy=True) as pool:
        for _ in range(2):
            with pytest.raises(ConfigError, match="cannot connect to a dask scheduler"):
                pool.map(_square, [1])
        assert not pool.started


@pytest.mark.timeout(180)
def test_a_background_pool_starts_beside_the_caller_and_ends_with_the_context(dask_pool):
    """``connect(background=True)``: the context is entered before the cluster is up (a thread starts it); the
    first task, or ``ready()``, waits for it; results arrive as they finish while another client (the session's,
    ``dask_pool``) stays this thread's current one (``Pool.map`` tracks its futures on its own client's loop).
    The thread ends the cluster with the context."""
    import threading

    from distributed import default_client

    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    other = dask_pool.client
    with other.as_current():
        with connect(ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB"), background=True) as pool:
            assert not pool.started and any(t.name == "bootprof-cluster" for t in threading.enumerate())
            pool.ready()
            assert pool.started and default_client() is other
            seen = []
            results = pool.map(_slow_square, range(4), on_result=lambda r: seen.append(r["x"]))
            assert [r["square"] for r in results] == [0, 1, 4, 9] and sorted(seen) == [0, 1, 2, 3]
            client = pool.client
        assert client.status == "closed"
        assert not any(t.name == "bootprof-cluster" for t in threading.enumerate())


def _slow_square(x):
    import time

    time.sleep(0.05 * (x % 3))
    return {"x": x, "square": x * x, "extra": [x] * 3}


@pytest.mark.parametrize("inline", [False, True])
def test_pool_hands_each_result_over_as_it_arrives(dask_pool, inline):
    """``on_result`` sees every result once, as it finishes (workers and inline), may take parts of it,
    and the list still comes back in the order of the items."""
    from pipeline.cluster import Pool

    pool = Pool(None) if inline else dask_pool
    seen = []
    results = pool.map(_slow_square, range(9), on_result=lambda r: seen.append((r["x"], r.pop("extra"))))
    assert [r["square"] for r in results] == [x * x for x in range(9)]
    assert sorted(seen) == [(x, [x] * 3) for x in range(9)]
    assert all("extra" not in r for r in results)


def _log_as_distributed_worker(_item):
    """A task: log what distributed logs when a heartbeat meets a closing scheduler, and another error."""
    import logging

    log = logging.getLogger("distributed.worker")
    try:
        raise OSError("stream closed")
    except OSError:
        log.exception("Failed to communicate with scheduler during heartbeat.")
        log.exception("another worker error")
    return True


def test_local_workers_keep_quiet_about_a_closing_scheduler():
    """A local worker drops the heartbeat error that distributed logs (with a traceback) when the cluster
    closes during a heartbeat, and logs every other error as before: on stderr, which a worker shares
    with the command."""
    code = ("from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_cluster import _log_as_distributed_worker\n"
            "if __name__ == '__main__':\n"
            "    with connect(ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')) as pool:\n"
            "        print(pool.map(_log_as_distributed_worker, [None]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[True]", out.stderr
    assert "another worker error" in out.stderr
    assert "heartbeat" not in out.stderr


def _sigint_self(_item) -> int:
    """A task: send this worker a SIGINT (as a Ctrl-C at the terminal does), then say which process it is."""
    import time

    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    return os.getpid()


def test_local_workers_leave_ctrl_c_to_the_command():
    """A Ctrl-C reaches every process of the command's group: a local worker ignores it (the command ends and
    closes its cluster), instead of dying with a traceback beside the command's own 'interrupted'."""
    code = ("from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_cluster import _sigint_self\n"
            "if __name__ == '__main__':\n"
            "    with connect(ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')) as pool:\n"
            "        first = pool.map(_sigint_self, [None])\n"
            "        print(first == pool.map(_sigint_self, [None]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr       # (the same worker, twice)
    assert "KeyboardInterrupt" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def _warm_state(_item):
    """A task: whether this worker has loaded the kernels, and whether its warm-up thread still runs."""
    import sys
    import threading

    kernels = sys.modules.get("pipeline.decode.etl.kernels")
    loaded = len(kernels.group_by_code.overloads) if kernels is not None and hasattr(kernels, "group_by_code") else 0
    return loaded, any(t.name == "bootprof-warm-up" for t in threading.enumerate())


def test_workers_load_the_stages_kernels_before_the_first_task():
    """A local worker imports the warm-up modules and loads their cached numba kernels on its own, and the
    pool's first map sends its task only once it has: the task finds the warm-up ended."""
    import numpy as np

    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig
    from pipeline.decode.etl import kernels as K

    K.group_by_code(np.zeros(4, np.int32), 1)           # compiled and cached by this process at least once
    with connect(ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB"),
                 warm_up=["pipeline.decode.etl.kernels"]) as pool:
        [(loaded, running)] = pool.map(_warm_state, [None])
    assert loaded >= 1, "the worker did not load the cached kernels"
    assert not running, "a task ran while the worker's warm-up still ran"


def test_warm_up_loads_only_cached_code_and_survives_bad_names(tmp_path):
    """In a fresh process: every overload loaded comes from the cache (nothing is compiled), and a module
    that does not exist is skipped."""
    import subprocess
    import sys

    code = ("import numba.core.dispatcher as d, pipeline.cluster.warmup as w\n"
            "compiled = []\n"
            "d._FunctionCompiler._compile_core = lambda self, *a: compiled.append(a) or (False, None)\n"
            "print(w.warm_up(['pipeline.no_such_module', 'pipeline.decode.etl.kernels']), len(compiled))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    loaded, compiled = map(int, out.stdout.split())
    assert loaded >= 1 and compiled == 0


def test_kernels_that_python_calls_are_public():
    """Warm-up (workers) loads the kernels a module exports and skips the private ones, which only other kernels call
    and whose cached code holds them. A private kernel called from Python was loaded in every command instead:
    symbolize's image lookup, 0.09 s of each `bootprof symbolize`."""
    import ast

    def jitted(fn: ast.FunctionDef) -> bool:
        names = [(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]
        return any((n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")) in ("njit", "jit") for n in names)

    found = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        private = {f.name for f in functions if jitted(f) and f.name.startswith("_")}
        for f in functions:
            if not jitted(f):
                found += [f"{path.relative_to(ROOT)}: {f.name} calls {n.id}" for n in ast.walk(f)
                          if isinstance(n, ast.Name) and n.id in private]
    assert not found, found


def test_worker_modules_do_not_import_the_config():
    """What a decode worker imports (dask's preload ``pipeline.cluster.warmup``, and the stages' WARM_UP) stays free
    of the CLI's config layer (pydantic): a worker imports it as it starts, and a heavier import made its first
    tasks wait (0.2-0.4 s a run)."""
    from pipeline.decode import WARM_UP

    code = ("import sys\n" + "".join(f"import {m}\n" for m in ("pipeline.cluster.warmup", *WARM_UP))
            + "print(sorted(m for m in ('pipeline.config', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def _fork_state(_item):
    """A task: this worker's parent, the process that warmed each module up, and whether the kernels are loaded."""
    import os
    import sys

    from pipeline.cluster import warmup

    kernels = sys.modules.get("pipeline.decode.etl.kernels")
    loaded = len(kernels.group_by_code.overloads) if kernels is not None else 0
    return os.getppid(), os.getpid(), dict(warmup._warmed), loaded


def test_local_workers_are_forked_warm_from_one_server():
    """Local workers are forked from a server that imported the warm-up modules and loaded their kernels
    once: each worker (of two) has them before its first task without warming up itself, and both have the
    same parent, which is not the process that started the cluster."""
    code = ("import os\n"
            "from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_cluster import _fork_state\n"
            "if __name__ == '__main__':\n"
            "    import numpy as np\n"
            "    from pipeline.decode.etl import kernels as K\n"
            "    K.group_by_code(np.zeros(4, np.int32), 1)\n"     # (compiled and cached at least once)
            "    with connect(ClusterConfig(mode='local', n_workers=2, memory_limit='1GiB'),\n"
            "                 warm_up=['pipeline.decode.etl.kernels']) as pool:\n"
            "        print(repr((os.getpid(), pool.map(_fork_state, [0, 1, 2, 3]))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    client, states = eval(out.stdout)      # noqa: S307 - our own repr
    parents = {ppid for ppid, _, _, _ in states}
    assert len(parents) == 1 and client not in parents, states
    assert len({pid for _, pid, _, _ in states}) == 2, "expected the tasks on both workers"
    for ppid, pid, warmed, loaded in states:
        assert warmed.get("pipeline.decode.etl.kernels") == ppid, f"worker {pid} warmed the kernels itself: {warmed}"
        assert loaded >= 1


def _environment(_item):
    import os

    return os.environ.get("BOOTPROF_TEST_PROBE"), os.environ.get("MIMALLOC_PURGE_DELAY")


def test_forked_workers_see_the_environment_of_their_cluster_start():
    """A worker forked from a server started for an earlier cluster still gets this process's environment as
    it is when its own cluster starts (as a spawned worker would), and the workers' own settings."""
    code = ("import os\n"
            "from pipeline.cluster import connect\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_cluster import _environment\n"
            "if __name__ == '__main__':\n"
            "    cfg = ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')\n"
            "    with connect(cfg) as pool:\n"
            "        print(pool.map(_environment, [0]))\n"
            "    os.environ['BOOTPROF_TEST_PROBE'] = 'set later'\n"
            "    with connect(cfg) as pool:\n"
            "        print(pool.map(_environment, [0]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[(None, '1000')]", "[('set later', '1000')]"], out.stdout


def _burn_cpu(seconds):
    import time

    # (CPU time, not wall time: on a loaded machine a wall-clock second held 0.896 s of CPU, and the check below
    # failed although nothing was wrong)
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return True


def test_the_fork_server_and_its_workers_are_waited_for():
    """At exit the process waits for the fork server, which waited for its workers: their CPU time is the
    process's children's (what the benchmarks add up), and nothing is left running."""
    code = ("import resource\n"
            "from pipeline.cluster import connect, forkserver\n"
            "from pipeline.config import ClusterConfig\n"
            "from tests.test_cluster import _burn_cpu\n"
            "if __name__ == '__main__':\n"
            "    with connect(ClusterConfig(mode='local', n_workers=1, memory_limit='1GiB')) as pool:\n"
            "        pool.map(_burn_cpu, [1.0])\n"
            "    before = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "    forkserver.stop()\n"         # (what exiting does: an atexit handler)
            "    after = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "    print(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) >= 0.9      # (the task's second, on a core of its own when the machine is idle)


def test_small_inputs_run_in_process_without_a_cluster(tmp_path):
    """Below cluster.inline_below (64MB) a local cluster is not started: the tasks run in this process; at or
    above it, or with inline_below 0, the cluster starts; other modes are as configured."""
    from pipeline.cluster import connect, runs_inline
    from pipeline.sources import input_bytes
    from pipeline.units import Size
    from pipeline.config import ClusterConfig
    from tests.conftest import fixture_path

    small = fixture_path("etl/perfview-net45-x86/PerfViewData.etl")
    size = input_bytes([small, fixture_path("selfprofile/workspace-clean")])
    assert size == small.stat().st_size + sum(p.stat().st_size for p in
                                              fixture_path("selfprofile/workspace-clean").rglob("*.mm_profdata"))
    local = ClusterConfig(mode="local", n_workers=1, memory_limit="1GiB")
    assert runs_inline(local, size) and not runs_inline(local, 64_000_000) and not runs_inline(local, None)
    assert not runs_inline(local.model_copy(update={"inline_below": Size(0)}), 1)
    assert not runs_inline(ClusterConfig(mode="address", address="tcp://127.0.0.1:1"), 1)
    with connect(local, size=size) as pool:
        assert pool.client is None and pool.map(abs, [-1, -2]) == [1, 2]
    with connect(local.model_copy(update={"inline_below": Size(0)}), size=size) as pool:
        assert pool.client is not None and pool.map(abs, [-3]) == [3]


def test_stages_size_their_workers_by_what_they_hand_them(tmp_path):
    """The aggregate and report stages hand workers only the self-profiles' sections (the ETL trace's run in
    DuckDB in the stage's process): their cluster is sized by the self-profiles' bytes, not by the trace's."""
    from pipeline import decode
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.runs import decoded_input_bytes, self_profile_bytes
    from tests.conftest import fixture_path

    trace = fixture_path("etl/perfview-net45-x86/PerfViewData.etl")
    profiles = fixture_path("selfprofile/workspace-clean")
    assert self_profile_bytes(tmp_path / "none") is None
    decode.run(tmp_path / "both", Config(), Pool(None), inputs=[trace, profiles])
    profile_bytes = sum(p.stat().st_size for p in profiles.rglob("*.mm_profdata"))
    assert self_profile_bytes(tmp_path / "both") == profile_bytes
    assert decoded_input_bytes(tmp_path / "both") == profile_bytes + trace.stat().st_size
    decode.run(tmp_path / "etl", Config(), Pool(None), inputs=[trace])
    assert self_profile_bytes(tmp_path / "etl") == 0

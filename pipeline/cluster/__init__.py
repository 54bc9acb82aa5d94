"""The cluster: where a stage's tasks run, and the processes behind it.

- :mod:`~pipeline.cluster.pool`: the :class:`Pool` a stage maps its tasks over (a dask client, or this process),
  made by :func:`connect` from ``cluster:`` of the config; :func:`run_once` runs one stage with one.
- :mod:`~pipeline.cluster.forkserver`: the process that local workers (and the report's :func:`processes`) are
  forked from, started once per process.
- :mod:`~pipeline.cluster.prefork`: what that server imports as it starts (multiprocessing's preload).
- :mod:`~pipeline.cluster.warmup`: in a worker (dask's preload): the stages' modules and compiled kernels loaded
  before the first task.
- :mod:`~pipeline.cluster.gcpolicy`: what the garbage collector scans, in the command's process and in the workers.

Workers import this package as they start (``warmup``, ``gcpolicy``): none of its modules imports the
configuration (pydantic) at its top.
"""

from pipeline.cluster.forkserver import processes
from pipeline.cluster.pool import Pool, connect, run_once, runs_inline

__all__ = ["Pool", "connect", "processes", "run_once", "runs_inline"]

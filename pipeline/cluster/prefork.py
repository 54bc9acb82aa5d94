"""Imported by the fork server of local dask workers (:func:`pipeline.cluster.forkserver.start`, as multiprocessing's
fork-server preload): importing it warms the server up, so that every worker forked from it starts with
distributed, the stages' modules and their compiled kernels loaded (:func:`pipeline.cluster.warmup.prepare_fork_server`).
Nothing else imports it."""

import atexit
import os

from pipeline.cluster import warmup

try:
    warmup.prepare_fork_server()
except Exception:       # noqa: BLE001 - the server must start (multiprocessing forgives ImportError only): a
    pass                # worker forked from a cold server warms itself up (warmup.dask_setup)
# The server ends when the process that started it does, which waits for it (``forkserver.stop``):
# without the teardown of its imports. Forked workers never run it: they end with os._exit.
atexit.register(os._exit, 0)

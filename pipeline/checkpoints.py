"""Named moments of a command where a test can hold it, as failpoints do (etcd's gofail, TiKV's fail-rs): a test that
needs a command to be at a given moment (a Ctrl-C just before the warehouse commits, an input replaced while it is
decoded) makes it be there instead of sleeping and hoping, on a fast machine or a loaded one.

``BOOTPROF_PAUSE_AT`` names checkpoints (comma-separated) and ``BOOTPROF_PAUSE_DIR`` a directory. At a named
checkpoint the process writes ``DIR/NAME.reached`` (its pid) and waits until ``DIR/NAME.go`` exists; a signal that
arrives meanwhile is handled there, as it would be at that line. Without the variables (always, outside the tests)
a checkpoint costs one look-up of the environment."""

from __future__ import annotations

import os
import time
from pathlib import Path

#: The longest a checkpoint holds a command (a test that never says go does not leave it hanging).
HOLD_S = 600.0


def checkpoint(name: str) -> None:
    names = os.environ.get("BOOTPROF_PAUSE_AT")
    if not names or name not in names.split(","):
        return
    where = Path(os.environ["BOOTPROF_PAUSE_DIR"])
    go = where / f"{name}.go"
    reached = where / f"{name}.reached"
    tmp = reached.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(str(os.getpid()), encoding="utf-8")
    os.replace(tmp, reached)
    end = time.monotonic() + HOLD_S
    while not go.exists() and time.monotonic() < end:
        time.sleep(0.005)

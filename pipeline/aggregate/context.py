"""What an aggregate section gets (:class:`Context`): where to read and write, the config, the pool, what other
sections hand it, and a wait for ``symbolized/`` to be final (:class:`FramesFinal`)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline import steps, timings
from pipeline.runs import StageOutput, has_table, read_manifest, table_path
from pipeline.stages import DECODED, SYMBOLIZED

if TYPE_CHECKING:
    from pipeline.cluster import Pool
    from pipeline.config import Config
    from pipeline.contracts import Manifest

SOURCE = DECODED


@dataclass
class Context:
    """What a section gets: where to read, where to write, the config and the dask pool."""

    run_dir: Path
    config: Config
    pool: Pool
    out: StageOutput              # of aggregated/
    decoded: Manifest             # of decoded/
    #: Waits until ``symbolized/`` is final (``run(after=...)``: the stage started while symbolize ran); a
    #: section calls it (through ``resolve.has_frames``) before it reads frames.
    frames_final: FramesFinal
    offers: dict[str, Future] = field(default_factory=dict)     # (``OFFERS`` of the sections that run)
    #: How many sections run at once (:func:`parallel_sections`): they share ``aggregate.memory_limit``.
    at_once: int = 1
    #: Each section's seconds and its largest statements and waits (:mod:`pipeline.timings`), for the manifest.
    timings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def offer(self, key: str, value: Any) -> None:
        """Hand ``value`` to the sections that wait for ``key`` (once; a section that offers nothing hands them
        None as it ends)."""
        future = self.offers.get(key)
        if future is not None and not future.done():
            future.set_result(value)

    def wants(self, key: str) -> bool:
        return key in self.offers

    def take(self, key: str) -> Any:
        """What the section that offers ``key`` handed over, once it has (None when it does not run or offers
        nothing); for one taker: the offer is dropped, and its memory goes when the taker is done with it."""
        future = self.offers.get(key)
        if future is None:
            return None
        try:
            return future.result()
        finally:
            self.offers.pop(key, None)

    def has(self, table: str) -> bool:
        return has_table(self.run_dir, SOURCE, table)

    def source(self, table: str) -> Path:
        return table_path(self.run_dir, SOURCE, table)


class FramesFinal:
    """``Context.frames_final``: returns once ``symbolized/`` is final (at once without ``after``), and raises what
    symbolize raised, or a ``symbolized/`` made from another decode. With ``after``, a daemon thread waits for it,
    so that the sections that wait can be let go (``cancel``) when the stage is interrupted."""

    class Cancelled(Exception):
        pass

    def __init__(self, run_dir: Path, after: Callable[[], Any] | None):
        import threading

        self.cancelled = threading.Event()

        def wait() -> None:
            if after is not None:
                after()
            if has_table(run_dir, SYMBOLIZED, "frames"):
                read_manifest(run_dir, SYMBOLIZED)      # (refuses frames made from another decode)

        if after is None:
            wait()
            self.final: Future = Future()
            self.final.set_result(None)
        else:
            self.final = steps.beside(wait, "aggregate-frames")

    def __call__(self) -> None:
        with timings.step("wait symbolized"):
            if not steps.wait_for([self.final], stop=self.cancelled, step=0.1):
                raise FramesFinal.Cancelled("the aggregate stage was interrupted")
        self.final.result()

    def cancel(self) -> None:
        self.cancelled.set()

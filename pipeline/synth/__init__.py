"""Synthesizer (``bootprof synth``, and a job's demo trace): a synthetic ETL trace of a rustc stage-2 bootstrap
with its exact ground truth.

Entry point: :func:`run` (:mod:`.synthesize`). Writes ``out`` (the .etl), ``<stem>.truth.json`` beside it and
Breakpad symbol files under ``<trace dir>/symbols/``. Same seed and config -> byte-identical files.
The byte layouts are the synthesizer's own (``layout.py``), independent of ``pipeline/decode``.
"""

from pipeline.synth.synthesize import PROFILE_DIR, run

__all__ = ["PROFILE_DIR", "run"]

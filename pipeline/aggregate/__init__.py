"""Aggregate stage: decoded tables -> summaries in ``RUN_DIR/aggregated/``.

Entry point: :func:`run` (:mod:`.stage`). The stage is a list of sections (``SECTIONS``), each a function of a
sibling module (:mod:`.cpu`, :mod:`.memory`, :mod:`.processes`, :mod:`.queries`, :mod:`.query_cpu`) that writes its
tables and returns its counts; they share the SQL of :mod:`.resolve` and get a :class:`.context.Context`.
"""

from pipeline.aggregate.context import Context, FramesFinal
from pipeline.aggregate.stage import OFFERS, ON_CALLER, SECTIONS, STAGE, headline, parallel_sections, run, section_name

__all__ = ["OFFERS", "ON_CALLER", "SECTIONS", "STAGE", "Context", "FramesFinal", "headline", "parallel_sections", "run",
           "section_name"]

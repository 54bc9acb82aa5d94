"""Report stage: ``RUN_DIR/report/index.html`` plus one set of files per section.

Entry point: :func:`run` (:mod:`.stage`). Like the aggregate stage, the report is a list of sections (``SECTIONS``),
each a function of a sibling module that writes its files and returns the fragment ``index.html`` shows
(:class:`.base.Section`), or None when the run has nothing for it.
"""

from pipeline.report.base import STATIC, Context, Section, page
from pipeline.report.stage import IN_PROCESS, SECTIONS, STAGE, headline, render_index, run, run_sections

__all__ = ["IN_PROCESS", "SECTIONS", "STAGE", "STATIC", "Context", "Section", "headline", "page", "render_index", "run",
           "run_sections"]

"""What every part of the report shares: a section's result (:class:`Section`), what a section gets
(:class:`Context`), the page frame (:func:`page`) and the static files. The sections import this, never the
package, whose ``__init__`` imports them."""

from __future__ import annotations

import html
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.runs import StageOutput, has_table, read_table

if TYPE_CHECKING:
    from pipeline.cluster import Pool
    from pipeline.config import Config

STATIC = Path(__file__).with_name("static")


@dataclass
class Section:
    """One part of index.html: an anchor id, a title, an HTML fragment and the files it wrote."""

    id: str
    title: str
    html: str
    files: list[str] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)      # its counts, kept in the manifest
    seconds: float | None = None        # what it took (the manifest's ``timings``)


@dataclass
class Context:
    run_dir: Path
    config: Config
    pool: Pool
    out: StageOutput      # of report/

    def has(self, stage: str, table: str) -> bool:
        return has_table(self.run_dir, stage, table)

    def recorder(self) -> str:
        """What recorded the run's samples, for the sections' titles: ``perf`` (a Linux perf.data) or ``ETL``."""
        return "perf" if self.has("decoded", "perf_file") else "ETL"

    def read(self, stage: str, table: str, columns: list[str] | None = None, dictionary: tuple[str, ...] = ()):
        return read_table(self.run_dir, stage, table, columns, dictionary)

    def copy_static(self, name: str) -> str:
        """Copy ``static/<name>`` into the report; returns its relative path."""
        (self.out.path / "static").mkdir(exist_ok=True)
        shutil.copyfile(STATIC / name, self.out.path / "static" / name)
        return f"static/{name}"


def page(title: str, body: str, head: str = "") -> str:
    """A complete HTML page with the report's stylesheet."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="static/report.css">{head}</head>
<body>
{body}
</body></html>
"""

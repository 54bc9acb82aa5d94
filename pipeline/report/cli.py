"""``bootprof report --run RUN_DIR``"""

from __future__ import annotations

from pipeline import sources
from pipeline.stages import REPORTED


def add_arguments(p) -> None:
    p.add_argument("--run", dest="run_dir", type=sources.run_dir, required=True,
                   help="run directory (or a store's URL: s3://...) with an aggregated/ output")


def main(args, config) -> int:
    from pipeline.cluster import run_once
    from pipeline.runs import self_profile_bytes

    # (workers only for the self-profiles' sections; the ETL trace's run here, in DuckDB)
    summary = run_once("report", args.run_dir, config, self_profile_bytes(args.run_dir))
    print(f"report: {args.run_dir / REPORTED / 'index.html'}")
    for section, counts in summary.items():
        print(f"  {section}: {shown(counts)}")
    return 0


def shown(counts: dict[str, object]) -> str:
    """A section's counts on one line: its numbers (times in seconds), not the rows and lists it also keeps."""
    parts = []
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key.endswith("_ns"):
            parts.append(f"{key[:-3].replace('_', ' ')} {value / 1e9:,.2f} s")
        else:
            parts.append(f"{key.replace('_', ' ')} {value:,.4g}" if isinstance(value, float) else
                         f"{key.replace('_', ' ')} {value:,}")
    return ", ".join(parts) or "written"

"""The files bootprof ships beside its code: the jobs (``jobs/``) and the configs with the WPR recording profiles
(``configs/``). In a checkout they are the project's own directories; an installed wheel holds copies of them in
the package (``pipeline/shipped/``, put there by ``setup.py`` as the wheel is built), so that ``capture --wpr`` finds
its profile and ``bootprof run nightly`` its job wherever the command runs."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent


def directory(kind: str) -> Path:
    """``jobs`` or ``configs``: the wheel's copy where there is one, else the checkout's."""
    shipped = PACKAGE / "shipped" / kind
    return shipped if shipped.is_dir() else PACKAGE.parent / kind


def job_names() -> list[str]:
    return sorted(p.stem for p in directory("jobs").glob("*.yaml"))


def job_path(given: Path | str) -> Path:
    """A job as typed: a file that exists; else a name (``nightly``, ``nightly.yaml``, or ``jobs/nightly.yaml`` typed
    outside the project): ``jobs/NAME.yaml`` of the working directory, then bootprof's own."""
    path = Path(given)
    if path.is_file():
        return path
    parts = path.parts
    if path.suffix.lower() in ("", ".yaml", ".yml") and (len(parts) == 1 or (len(parts) == 2 and parts[0] == "jobs")):
        for base in (Path.cwd() / "jobs", directory("jobs")):
            found = base / f"{Path(parts[-1]).stem}.yaml"
            if found.is_file():
                return found
    raise ConfigError(f"{given}: no such job file, and no job of that name (bootprof's own: "
                      f"{', '.join(job_names()) or 'none found'})")


def job_config(job_file: Path, config: Path) -> Path:
    """A job's ``config:``: as written when absolute, else relative to the project the job file is in (``jobs/x.yaml``
    -> ``configs/...`` beside ``jobs/``), so a job runs from any directory with its own config (not a file of that
    name in another project's working directory), else relative to the working directory."""
    if config.is_absolute():
        return config
    beside = job_file.resolve().parent.parent / config
    if beside.exists():
        return beside
    if config.exists():
        return config
    raise ConfigError(f"{job_file}: config: {config} is neither in the working directory {Path.cwd()} nor in "
                      f"{job_file.resolve().parent.parent}: name one with --config")

"""Errors that reach the user as one clear line instead of a traceback."""


class BootprofError(Exception):
    """Base class: the CLI prints the message and exits non-zero."""


class ConfigError(BootprofError):
    """A configuration or job file is invalid. The message names the file, the key and what was expected."""


class InputError(BootprofError):
    """An input file cannot be used at all (not the format, unreadable). Names the file and the place."""


class ManifestError(BootprofError):
    """A stage output is missing, incomplete or written by a newer bootprof."""


def out_of_memory(where: object, work: str, setting: str, value: str, exc: BaseException) -> ConfigError:
    """DuckDB ran out of memory although it spills to disk (some of its work cannot): the error names the
    file or run, the ``work`` that needed more and the ``setting`` (now ``value``) to raise, not a traceback."""
    detail = (str(exc).splitlines() or [type(exc).__name__])[0]
    return ConfigError(f"{where}: {work} needed more memory than {setting} ({value}) allows; raise it. "
                       f"DuckDB: {detail}")


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: Python's ``KeyboardInterrupt``, or what DuckDB raises instead when the signal
    arrives during one of its queries on the main thread (``RuntimeError('Query interrupted')`` in DuckDB 2.0,
    ``duckdb.InterruptException`` in 1.x)."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if type(exc).__name__ == "InterruptException" and type(exc).__module__.startswith("duckdb"):
        return True
    return type(exc) is RuntimeError and str(exc) == "Query interrupted"

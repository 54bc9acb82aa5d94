"""Errors that reach the user as one clear line instead of a traceback."""


class BootprofError(Exception):
    """Base class: the CLI prints the message and exits non-zero."""


class ConfigError(BootprofError):
    """A configuration or job file is invalid. The message names the file, the key and what was expected."""


class InputError(BootprofError):
    """An input file cannot be used at all (not the format, unreadable). Names the file and the place."""


class ManifestError(BootprofError):
    """A stage output is missing, incomplete or written by a newer bootprof."""


def out_of_memory(where: object, work: str, setting: str, value: object, exc: BaseException) -> ConfigError:
    """DuckDB ran out of memory although it spills to disk (some of its work cannot): the error names the
    file or run, the ``work`` that needed more and the ``setting`` (now ``value``: a config's size is shown as it
    was written, its ``text``) to raise, not a traceback."""
    detail = (str(exc).splitlines() or [type(exc).__name__])[0]
    shown = getattr(value, "text", value)
    return ConfigError(f"{where}: {work} needed more memory than {setting} ({shown}) allows; raise it. "
                       f"DuckDB: {detail}")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI runner cancelling a job, ``kill``), raised in the main thread as a Ctrl-C is: every ``with`` on
    the way out runs, so the command's workers, fork server and DuckDB connections end with it."""


#: What a command has done that an interrupt after it must not leave unsaid ("run X was committed to W"): the CLI
#: names it in the line it prints for a Ctrl-C or SIGTERM.
DONE: list[str] = []


def is_duckdb_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of DuckDB's errors (told by its module: this module imports no DuckDB)."""
    return any(t.__module__.startswith(("duckdb", "_duckdb")) for t in type(exc).__mro__[:-2])


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: Python's ``KeyboardInterrupt``, or what DuckDB raises instead when the signal
    arrives during one of its queries on the main thread (``RuntimeError('Query interrupted')`` in DuckDB 2.0,
    ``duckdb.InterruptException`` in 1.x), or the ``RuntimeError`` that Python 3.11 raises from a
    ``KeyboardInterrupt`` that came while a class was made (``Error calling __set_name__``: a Ctrl-C or SIGTERM
    during an import, such as DuckDB's, that a stage does when it starts)."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if type(exc) is RuntimeError and isinstance(exc.__cause__, KeyboardInterrupt):
        return True
    if type(exc).__name__ == "InterruptException" and type(exc).__module__.startswith("duckdb"):
        return True
    return type(exc) is RuntimeError and str(exc) == "Query interrupted"


#: What a full or read-only disk, or a place this user may not write, is called by the OS, Arrow and DuckDB.
_PLACE_ERRNOS = {28: "no space left on the device", 122: "the disk quota is exceeded", 30: "the file system is read-only",
                 13: "permission denied"}
_HELD = "the file is open in another process (a virus scanner, an indexer, an editor?)"
#: Windows' own codes, before the errno Python maps them to (a sharing violation is EACCES there).
_PLACE_WINERRORS = {32: _HELD, 33: _HELD, 112: "no space left on the device", 39: "no space left on the device",
                    5: "permission denied"}
_PLACE_WORDS = {"No space left on device": "no space left on the device", "Disk quota exceeded": "the disk quota is exceeded",
                "Read-only file system": "the file system is read-only", "Permission denied": "permission denied",
                # (Windows' words, as Arrow and DuckDB pass them on)
                "There is not enough space on the disk": "no space left on the device",
                "being used by another process": _HELD, "Access is denied": "permission denied"}


def place_error(exc: BaseException) -> str | None:
    """One line for an error of the place being written (a full or read-only disk, no permission), wherever in the
    stack it came from (Python, Arrow, DuckDB, a dask worker): what happened and the file, if one is named; None
    for any other error."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        what = _PLACE_WINERRORS.get(getattr(exc, "winerror", None) or -1) or \
            _PLACE_ERRNOS.get(getattr(exc, "errno", None) or -1)
        text = str(exc)
        if what is None:
            what = next((v for k, v in _PLACE_WORDS.items() if k in text), None)
        if what is not None:
            where = getattr(exc, "filename", None)
            if not where:
                import re

                m = re.search(r"""(?:["'])((?:/|[A-Za-z]:[\\/]|\\\\)[^"']+)(?:["'])""", text)
                where = m.group(1) if m else None
            return f"{where}: {what}" if where else f"{what}: {' '.join(text.split())[:300]}"
        exc = exc.__cause__ or exc.__context__
    return None

"""Errors that reach the user as one clear line instead of a traceback."""


class BootprofError(Exception):
    """Base class: the CLI prints the message and exits non-zero."""


class ConfigError(BootprofError):
    """A configuration or job file is invalid. The message names the file, the key and what was expected."""


class InputError(BootprofError):
    """An input file cannot be used at all (not the format, unreadable). Names the file and the place."""


class ManifestError(BootprofError):
    """A stage output is missing, incomplete or written by a newer bootprof."""

"""bootprof: performance traces of rustc bootstrap builds, decoded on Linux."""

__version__ = "0.1.0"

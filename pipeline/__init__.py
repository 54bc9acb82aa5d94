"""bootprof: performance traces of rustc bootstrap builds, decoded on Windows, macOS and Linux."""

__version__ = "0.1.0"

#: What every command sets in its environment, if unset, before numpy is first imported (:func:`pipeline.cli.main`),
#: and what the processes of local dask workers start with: one BLAS thread. Nothing here multiplies matrices, and
#: OpenBLAS's idle threads spin on a core the stages need (what dask already sets for the workers it spawns).
ENV_DEFAULTS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

"""Linux ``perf.data`` decoder: ``perf record`` files -> the ``decoded/`` tables the ETL decoder writes.

Entry point :func:`decode_perf` (:mod:`.decoder`), called by the decode stage (:mod:`pipeline.decode.stage`) for an input that starts with ``PERFILE2``.
Three layers: ``header`` (file header, attrs, feature sections), ``kernels``/``records`` (the numba walk over
the data section's records), ``tables`` (processes, threads, images, samples, stacks); ``commands`` names the rustc
processes from the self-profiles decoded beside the file (:func:`name_from_profiles`). Tables and columns, and
what each means for perf: ``schema.md``.
"""

from pipeline.decode.perf.commands import name_from_profiles
from pipeline.decode.perf.decoder import FILE_TABLE, RECORD_COUNTS_TABLE, WARM_UP, decode_perf

__all__ = ["FILE_TABLE", "RECORD_COUNTS_TABLE", "WARM_UP", "decode_perf", "name_from_profiles"]

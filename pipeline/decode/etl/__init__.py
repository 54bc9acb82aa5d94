"""ETL decoder: buffer chain -> parallel partitions (numba) -> parquet parts -> global joins.

Entry point :func:`decode_etl` (:mod:`.decoder`), called by :func:`pipeline.decode.run`. The three layers live in
``buffers`` (bytes), ``kernels``/``batch``/``partition`` (per-partition decode) and ``interpret``
(the dispatch table); cross-buffer joins are in ``joins``. Tables and columns: ``schema.md``.
"""

from pipeline.decode.etl.decoder import decode_etl

__all__ = ["decode_etl"]

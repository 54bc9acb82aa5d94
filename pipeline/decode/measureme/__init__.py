"""rustc self-profiles (measureme ``.mm_profdata``) -> ``query_events`` and ``self_profiles``.

Entry point: :func:`decode_profiles` (:mod:`.decoder`), called by the decode stage for every MMPD file it finds.
Files are grouped into dask tasks by size; each task decodes its files (:mod:`.reader`), writes
one parquet part into ``decoded/query_events.parquet/`` and returns one metadata row per file.
A file that cannot be decoded gets ``status = 'error'`` and its message; the others go on.
Tables and columns: ``schema.md`` beside this file.
"""

from pipeline.decode.measureme.decoder import crate_of, decode_group, decode_profiles

__all__ = ["crate_of", "decode_group", "decode_profiles"]

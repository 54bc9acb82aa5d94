"""CPU samples (PerfInfo SampledProfile, §3.4): ``_samples``, which take their stack in the partition or
in the buckets."""

from __future__ import annotations

import numpy as np

from pipeline.decode.etl import kernels as K
from pipeline.decode.etl import layout as L
from pipeline.decode.etl.batch import Batch


# --- PerfInfo SampledProfile (§3.4) ----------------------------------------------------------------
def sampled_profile(b: Batch, idx: np.ndarray) -> None:
    S = L.SAMPLED_PROFILE
    n = len(idx)
    out = (np.empty(n, np.uint64), np.empty(n, np.uint32), np.empty(n, np.bool_), np.empty(n, np.int64),
           np.empty(n, b.c["cpu"].dtype), np.empty(n, np.int64))
    # The hottest kind (one record per sample): both fields, the length check and the row's common columns
    # (``Batch.common``, without timestamp_ns) in one pass.
    K.sampled_profile_records(b.blob, b.of_records(), idx, (S["ip"][0], *S["tid"], 12), out)
    ok = out[2]
    if not ok.all():
        b.require(idx[~ok], b.c["ptr"][idx[~ok]].astype(np.int64) + 8, "SampledProfile")   # reports them
        idx, out = idx[ok], tuple(a[ok] for a in out)
    ip, tid, _, ts, cpu, stream_pos = out
    # timestamp_ns is computed by the bucket that writes the sample: one column less to write and read back.
    # ``_rec`` (record index) lets the partition give each sample the stack pieces that follow it; not written.
    b.emit("_samples", {"timestamp": ts, "cpu": cpu, "stream_pos": stream_pos, "tid": tid, "ip": ip, "_rec": idx}, idx)

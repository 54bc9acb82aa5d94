"""Cross-buffer joins, run once all partitions are on disk (placeholder, filled next)."""

def finish(out, scratch, header):
    return {}

"""System configuration section of the report (WPA's "System Configuration" tab): the machine and the
recording, from ``decoded/trace`` and ``decoded/sysconfig``. Applies to ETL runs."""

from __future__ import annotations

from pipeline.report.flame import count, fmt_bytes, table
from pipeline.runs import has_table, read_table
from pipeline.stages import DECODED


def section(ctx):
    if not has_table(ctx.run_dir, DECODED, "trace"):
        return None
    from pipeline.report.base import Section

    trace = read_table(ctx.run_dir, DECODED, "trace").to_pylist()[0]
    cfg = (read_table(ctx.run_dir, DECODED, "sysconfig").to_pylist()[:1]
           if has_table(ctx.run_dir, DECODED, "sysconfig") else [])
    machine = cfg[0] if cfg else {}
    start, end = trace.get("start_utc"), trace.get("end_utc")
    rows = [
        ("computer", machine.get("computer_name")),
        ("Windows", f"{trace.get('os_version')} build {trace.get('os_build')}"),
        ("logical CPUs", machine.get("cpu_count") or trace.get("cpu_count")),
        ("CPU speed", f"{machine.get('cpu_mhz') or trace.get('cpu_speed_mhz')} MHz"),
        ("memory", fmt_bytes((machine.get("memory_mb") or 0) << 20) if machine.get("memory_mb") else None),
        ("page size / allocation granularity", f"{machine.get('page_size')} / {machine.get('allocation_granularity')}"
         if machine else None),
        ("pointer size", f"{trace.get('pointer_size')} bytes"),
        ("recorded", f"{start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S} UTC "
                     f"({(end - start).total_seconds():,.1f} s)" if start and end else None),
        ("logger", trace.get("logger_name")),
        ("clock", f"{count(trace.get('clock_frequency'))} ticks/s (ClockType {trace.get('clock_type')})"),
        ("trace file", f"{trace.get('file')} ({fmt_bytes(trace.get('file_size'))}, format {trace.get('log_format')})"),
        ("buffers", f"{count(trace.get('buffers'))} of {count(trace.get('buffers_written'))} written"
                    f"{'; ' + count(trace.get('buffers_skipped')) + ' skipped' if trace.get('buffers_skipped') else ''}"
                    f"{'; ' + count(trace.get('buffers_missing')) + ' missing' if trace.get('buffers_missing') else ''}"
                    f", {count(trace.get('compressed_buffers'))} compressed"),
        ("events lost", f"{count(trace.get('events_lost'))} (buffers lost: {count(trace.get('buffers_lost'))})"),
        ("records", count(trace.get("records"))),
    ]
    shown = [{"what": k, "value": v} for k, v in rows if v not in (None, "", "None / None")]
    body = table(shown, [("what", "", None), ("value", "", None)], "sysconfig")
    return Section("sysconfig", "System configuration", body, [], {"computer": machine.get("computer_name")})

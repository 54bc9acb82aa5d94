"""``scripts/same_decode.py``, the check that a decoder change keeps every table (issue 31): run for real against
``HEAD`` on two small fixtures (the same tables when the working tree's decoder is ``HEAD``'s, as in CI; a change
to the decoder that alters them fails here too), and on a file that does not decode, which it must report."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, fixture_path


def _same_decode(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/same_decode.py", "--no-synth", "--partition-bytes", "65536", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_same_decode_finds_the_same_tables_and_reports_what_does_not_decode(tmp_path):
    small = [str(fixture_path(f"etl/{name}")) for name in ("perfview-small/gcevents.etl", "msbuild/PerfViewData.etl")]
    proc = _same_decode(*small)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sum(line.startswith("same ") for line in proc.stdout.splitlines()) == 2 and "all the same" in proc.stdout

    junk = tmp_path / "not-a-trace.etl"
    junk.write_bytes(b"\x00" * 8192)
    proc = _same_decode(str(junk))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"DIFFERS  {junk}" in proc.stdout and "1 differ" in proc.stdout


def test_a_decoder_change_that_alters_a_table_is_reported(tmp_path):
    """In CI the working tree is ``HEAD``, so the check above compares a decoder with itself: here a copy of ``HEAD``
    whose decoder writes one field wrong (the trace table's ``perf_freq`` + 1) must be reported as differing."""
    tree = tmp_path / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), "HEAD"], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        source = tree / "pipeline" / "decode" / "etl" / "decoder.py"
        text = source.read_text()
        assert '"perf_freq": f["perf_freq"],' in text
        source.write_text(text.replace('"perf_freq": f["perf_freq"],', '"perf_freq": f["perf_freq"] + 1,'))
        proc = subprocess.run([sys.executable, "scripts/same_decode.py", "--no-synth", "--partition-bytes", "65536",
                               str(fixture_path("etl/perfview-small/gcevents.etl"))], cwd=tree, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "DIFFERS" in proc.stdout and "trace" in proc.stdout and "1 differ" in proc.stdout
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)

"""Run directories: atomic stage outputs, manifests and their schema versions, the content hash of an input."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from pipeline.errors import ManifestError
from pipeline.runs import SCHEMA_VERSION, read_manifest, read_table, sha256_tree, stage_output


def _table():
    import pyarrow as pa

    return pa.table({"x": pa.array([1, 2, 3], pa.int64())})


def test_stage_output_is_atomic_and_keeps_previous_output_on_failure(tmp_path):
    with stage_output(tmp_path, "decoded", config={"a": 1}) as out:
        out.write_table("t", _table())
        out.manifest["note"] = "first"
        assert not (tmp_path / "decoded").exists()  # nothing visible until the stage finishes
    first = read_manifest(tmp_path, "decoded")
    assert first["tables"] == {"t": 3} and first["note"] == "first"
    assert first["schema_version"] == SCHEMA_VERSION and len(first["config_hash"]) == 64

    with pytest.raises(RuntimeError):
        with stage_output(tmp_path, "decoded") as out:
            out.write_table("t", _table().slice(0, 1))
            raise RuntimeError("interrupted")
    assert read_manifest(tmp_path, "decoded")["note"] == "first"
    assert read_table(tmp_path, "decoded", "t").num_rows == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_reader_refuses_newer_schema_and_missing_stage(tmp_path):
    with pytest.raises(ManifestError, match="no finished 'decoded' output"):
        read_manifest(tmp_path, "decoded")
    with stage_output(tmp_path, "decoded") as out:
        out.write_table("t", _table())
    path = tmp_path / "decoded" / "_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="newer than this bootprof"):
        read_manifest(tmp_path, "decoded")


def test_the_content_hash_is_the_sha256_of_the_pieces_sha256s(tmp_path):
    """``sha256_tree`` against hashlib on the pieces, on one thread and on several, at piece edges; and
    against ``sha256sum`` of ``split``, as the docstring says to check it in a shell."""
    import hashlib

    data = os.urandom(1000)
    for n in (0, 1, 99, 100, 101, 1000):
        path = tmp_path / f"f{n}"
        path.write_bytes(data[:n])
        want = hashlib.sha256(b"".join(hashlib.sha256(data[i:min(i + 100, n)]).digest()
                                       for i in range(0, n, 100))).hexdigest()
        assert sha256_tree(path, piece=100, threads=1) == want
        assert sha256_tree(path, piece=100, threads=4) == want
    big = tmp_path / "big"
    big.write_bytes(os.urandom((64 << 20) + 12345))
    # (coreutils alone, always there: it once used xxd and skipped itself where xxd was missing)
    shell = subprocess.run(f"split -b 64M --filter='sha256sum | head -c64 | tr a-f A-F | basenc --base16 -d' {big} "
                           "| sha256sum", shell=True, capture_output=True, text=True, check=True).stdout.split()[0]
    assert sha256_tree(big) == shell

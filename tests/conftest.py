"""Shared test helpers. Fixtures are read in place from ../shared/fixtures and never copied."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
FIXTURES = SHARED / "fixtures"


def fixture_path(rel: str) -> Path:
    """Path of a shared fixture; the test fails (never skips) when it is missing."""
    path = FIXTURES / rel
    if not path.exists():
        pytest.fail(f"required fixture is missing: {path} (../shared/fixtures must sit beside the project)")
    return path


@pytest.fixture(scope="session")
def dask_pool():
    """A real dask LocalCluster on 127.0.0.1 with two worker processes, shared by the session."""
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    with connect(ClusterConfig(mode="local", n_workers=2, memory_limit="3GiB")) as pool:
        yield pool

"""Configuration: the settings file and job files, their errors (file, key, line and what was expected), sizes."""

from __future__ import annotations


import pytest

from pipeline.config import load_config, load_job
from pipeline.units import Size, parse_size
from pipeline.errors import ConfigError
from tests.conftest import ROOT


def test_default_config_file_matches_model_defaults():
    assert load_config(ROOT / "configs" / "default.yaml").resolved() == load_config(None).resolved()


def test_every_job_file_is_valid():
    jobs = sorted((ROOT / "jobs").glob("*.yaml"))
    assert jobs
    for job in jobs:
        load_job(job)


def test_config_error_names_file_key_line_and_expectation(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  mode: local\ndecode:\n  partition_bytes: lots\n  colour: blue\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    msg = str(err.value)
    assert f"{bad}:4: decode.partition_bytes" in msg and "integer" in msg and "'lots'" in msg
    assert f"{bad}:5: decode.colour: Extra inputs are not permitted" in msg


def test_sizes_are_checked_when_the_config_is_loaded(tmp_path):
    """Size settings fail at load time with the file, line and key, not later inside DuckDB or dask."""
    bad = tmp_path / "sizes.yaml"
    bad.write_text("cluster:\n  memory_limit: lots\ndecode:\n  join_memory_limit: 300KB\nsynth:\n  size: 1 parsec\n"
                   "aggregate:\n  memory_limit: 1MB\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    msg = str(err.value)
    assert f"{bad}:2: cluster.memory_limit: not a size: 'lots'" in msg
    assert f"{bad}:4: decode.join_memory_limit: at least 32 MiB (got '300KB')" in msg
    assert f"{bad}:6: synth.size: not a size: '1 parsec'" in msg
    assert f"{bad}:8: aggregate.memory_limit: at least 32 MiB (got '1MB')" in msg
    good = tmp_path / "good.yaml"
    good.write_text("cluster:\n  memory_limit: auto\ndecode:\n  join_memory_limit: 1.5GB\nsynth:\n  size: 64MiB\n")
    loaded = load_config(good)
    assert loaded.decode.join_memory_limit == 1_500_000_000 and loaded.decode.join_memory_limit.text == "1.5GB"
    assert loaded.cluster.memory_limit == "auto" and loaded.synth.size == 64 << 20
    assert loaded.resolved()["decode"]["join_memory_limit"] == "1.5GB"      # (as written, in manifests and docs)
    assert isinstance(loaded.cluster.inline_below, Size) and loaded.cluster.inline_below.text == "64MB"


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:notaport", "scheduler-without-port", "udp://127.0.0.1:8786"])
def test_a_bad_scheduler_address_is_a_config_error(address):
    from pipeline.cluster import connect
    from pipeline.config import ClusterConfig

    with pytest.raises(ConfigError, match=f"cluster.address '{address}': cannot connect to a dask scheduler"):
        with connect(ClusterConfig(mode="address", address=address)):
            pass


def test_config_error_on_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("cluster: [\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="nope.yaml: cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_parse_size():
    assert parse_size("1GB") == 10**9
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("1000") == 1000
    with pytest.raises(ConfigError):
        parse_size("big")

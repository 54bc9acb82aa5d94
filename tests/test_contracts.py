"""The typed contracts between stages (:mod:`pipeline.contracts`) hold on real runs, and a manifest that breaks the
common part is refused in one line that names its file. The runs of whole jobs check their manifests with
:func:`tests.conftest.contract_breaches` too (the demo job, a self-profile directory, the nightly history)."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import ManifestError
from pipeline.runs import read_manifest, stage_output
from tests.conftest import contract_breaches


def test_a_breach_of_a_stage_contract_is_found(tmp_path):
    """The check can fail: a key the type does not declare, a value of another type, a required key missing."""
    with stage_output(tmp_path, "decoded") as out:
        out.manifest.update({"etl": {"records": 5, "recrods": 1}})
    assert contract_breaches(tmp_path) == ["decoded.etl.recrods: not in the contract"]
    with stage_output(tmp_path, "decoded") as out:
        out.manifest.update({"etl": {"records": 5}, "self_profile": {"events": "many"}})
    assert contract_breaches(tmp_path) == ["decoded.self_profile.events: Input should be a valid integer"]
    with stage_output(tmp_path, "compare") as out:
        out.manifest.update({"verdict": "no change"})
    assert "compare.regressions_past_budget: Field required" in contract_breaches(tmp_path)


@pytest.mark.parametrize("damage, says", [
    (lambda m: m.pop("upstream"), "upstream: Field required"),
    (lambda m: m.pop("schema_version"), "schema_version: Field required"),
    (lambda m: m.update(tables={"samples": "12"}), "tables.samples: Input should be a valid integer"),
    (lambda m: m.update(inputs=[{"size": 3}]), "inputs.0.path: Field required"),
])
def test_a_manifest_that_breaks_the_common_part_is_refused_in_one_line(tmp_path, damage, says):
    with stage_output(tmp_path, "decoded"):
        pass
    path = tmp_path / "decoded" / "_manifest.json"
    manifest = json.loads(path.read_text())
    damage(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as err:
        read_manifest(tmp_path, "decoded")
    assert str(err.value) == f"{path}: not a bootprof manifest: {says}"
    path.write_text("[1, 2]")
    with pytest.raises(ManifestError, match=r"_manifest.json: not a bootprof manifest: a JSON list, not an object"):
        read_manifest(tmp_path, "decoded")

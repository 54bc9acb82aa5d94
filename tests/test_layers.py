"""The package's shape: no import cycle anywhere in ``pipeline/`` (imports inside functions count), layers you can
see (a runtime that imports no stage and no command line; stages; the job runner and the command line on top), the
registry as the one place a stage is known (a toy stage is one module and one row), and a small lint rule set."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import ROOT, fixture_path

PACKAGE = ROOT / "pipeline"
#: What every stage stands on: configuration, run directories, the cluster, inputs and stores, progress, errors, the
#: platform, the stage registry (which names stages, and imports none), the typed contracts between them, and the
#: named moments where a test can hold a command, the files shipped beside the code (jobs, configs), and where a
#: stage's time went (timings).
RUNTIME = {"pipeline", "pipeline.config", "pipeline.runs", "pipeline.sources", "pipeline.mirror", "pipeline.cluster",
           "pipeline.cluster.pool", "pipeline.cluster.forkserver", "pipeline.cluster.prefork",
           "pipeline.cluster.warmup", "pipeline.cluster.gcpolicy", "pipeline.progress", "pipeline.errors",
           "pipeline.portable", "pipeline.units", "pipeline.stages", "pipeline.contracts", "pipeline.steps",
           "pipeline.checkpoints", "pipeline.escape", "pipeline.packaged", "pipeline.timings"}
#: A stage's module may import another stage's only along the registry's ``upstream`` or here, each with its reason.
ACROSS = {
    ("pipeline.capture.record", "pipeline.decode"): "a capture decodes the trace it recorded, so `bootprof run` finds it done",
    ("pipeline.capture.perf", "pipeline.decode"): "a capture checks that what perf wrote is a perf.data file (sniff)",
    ("pipeline.capture.bundle", "pipeline.symbolize.pdbpublics"): "packing a run reads the PDB ids of its images",
    ("pipeline.capture.elfsymbols", "pipeline.symbolize"): "capture --perf --symbols copies the images its frames fall in",
    ("pipeline.capture.elfsymbols", "pipeline.symbolize.elf"): "... under the key and beside the debug file symbolize reads",
    ("pipeline.compare.verdict", "pipeline.report.flame"): "the comparison page draws a differential flame graph",
    ("pipeline.decode.cli", "pipeline.capture.bundle"): "a pack given to `bootprof decode` is unpacked as a capture",
}


def modules() -> dict[str, set[tuple[str, int]]]:
    """module -> the package's modules it imports (with the line), at module level or inside functions."""
    names = {p: ".".join(("pipeline",) + p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
             for p in PACKAGE.rglob("*.py")}
    known = set(names.values())
    graph: dict[str, set[tuple[str, int]]] = {}
    for path, name in names.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pipeline"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add((full if full in known else node.module, node.lineno))
            elif isinstance(node, ast.Import):
                deps |= {(a.name, node.lineno) for a in node.names if a.name in known}
        graph[name] = {(d, line) for d, line in deps if d in known and d != name}
    return graph


def layer(module: str) -> int:
    if module in RUNTIME:
        return 0
    if module in ("pipeline.cli", "pipeline.jobs", "pipeline.__main__") or module.endswith(("_cli", ".cli")):
        return 2
    return 1


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import ``a -> b`` of ``graph`` (module -> modules it imports) from which ``a`` is reached again."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    return sorted(f"{a} -> {b}" for a in graph for b in graph[a] if a in reachable(b))


def test_no_import_cycle_in_the_package():
    graph = {m: {d for d, _ in deps} for m, deps in modules().items()}
    assert len(graph) > 100
    assert not cycles(graph), cycles(graph)


def test_layers_import_downwards_and_stages_along_the_registry():
    from pipeline import stages

    def stage_of(module: str) -> str:
        return module.split(".")[1]

    def upstream(name: str) -> set[str]:
        try:
            row = stages.get(name)
        except KeyError:
            return set()
        out = set(row.upstream)
        for s in row.upstream:
            out |= upstream(s)
        return out

    wrong = []
    for module, deps in modules().items():
        for dep, line in deps:
            if layer(dep) > layer(module):
                wrong.append(f"{module}:{line} imports {dep}, a layer above it")
            elif layer(module) == layer(dep) == 1 and stage_of(dep) != stage_of(module) \
                    and stage_of(dep) not in upstream(stage_of(module)) and (module, dep) not in ACROSS:
                wrong.append(f"{module}:{line} imports {dep}, another stage's")
    assert not wrong, wrong


def test_a_new_stage_is_one_module_and_one_registry_row(tmp_path, capsys):
    """tests/toy_stage.py (counts the decoded self-profile events into ``toyed/``) and one ``register`` call: a job
    runs it after the decode, a rerun finds it up to date, and a new decode makes it stale."""
    from pipeline import stages
    from pipeline.cli import main
    from pipeline.runs import read_manifest

    stages.register(stages.Stage("toy", "tests.toy_stage", "toyed", upstream=("decode",)))
    try:
        job = tmp_path / "toy.yaml"
        job.write_text(f"name: toy\nstages: [decode, toy]\nruns_dir: {tmp_path / 'runs'}\n")
        config = tmp_path / "c.yaml"
        config.write_text("cluster: {mode: synchronous}\n")
        args = ["--config", str(config), "run", str(job), "--trace", str(fixture_path("selfprofile/hello-default")),
                "--run", str(tmp_path / "run")]
        assert main(args) == 0
        made = read_manifest(tmp_path / "run", "toyed")
        assert made["events"] == read_manifest(tmp_path / "run", "decoded")["self_profile"]["events"] > 0
        assert "toy" in capsys.readouterr().out
        assert main(args) == 0
        assert " ".join(capsys.readouterr().out.split()).endswith("toy skipped (up to date)")
        assert main([*args, "--force"]) == 0
        assert read_manifest(tmp_path / "run", "toyed")["upstream"] != made["upstream"]
    finally:
        stages._REGISTRY.pop("toy", None)


def test_lint():
    """ruff's pyflakes rules (unused imports and variables, undefined names), syntax errors, and text files opened
    without their encoding (the ANSI code page on Windows), on everything."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "pipeline", "scripts",
                           "bench", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_worker_side_modules_import_no_config_at_their_top():
    """A local worker imports ``pipeline.cluster`` as it starts (dask's preload, the fork server's, the collector
    policy): no module of that package imports the configuration (pydantic) at module level, only inside the
    functions that need it (tests/test_cluster.py runs the imports a worker makes)."""
    found = []
    for path in sorted((PACKAGE / "cluster").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names
                      if n.startswith(("pipeline.config", "pydantic"))]
    assert not found, found

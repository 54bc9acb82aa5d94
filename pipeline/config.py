"""Typed configuration: one YAML file, one section per stage, validated once.

Every model forbids unknown keys, so a typo is an error that names the file, the key path, its line
and what was expected, not a silently ignored setting. The resolved config (defaults filled in) is
stored in each stage's manifest. ``configs/default.yaml`` lists every field with its default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, GetPydanticSchema, ValidationError, field_validator
from pydantic_core import core_schema

from pipeline.errors import ConfigError
from pipeline.runs import canonical_hash
from pipeline.units import Size


def _checked_size(text: str, minimum: int) -> Size:
    """``text`` as a :class:`Size` of at least ``minimum`` bytes; else ValueError, which pydantic reports with the
    key."""
    try:
        value = Size(text)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if value < minimum:
        raise ValueError(f"at least {minimum >> 20} MiB" if minimum >= 1 << 20 else f"at least {minimum} bytes")
    return value


def _as_written(value: Any) -> Any:
    """A size as the config wrote it (the resolved config, ``--set``, docs); any other value as it is."""
    return value.text if isinstance(value, Size) else value


def _size_field(check, integers: bool = False) -> GetPydanticSchema:
    """A field written as text ('64MiB') and held as what ``check(text)`` makes of it (a :class:`Size`), dumped as
    the text again. ``integers``: a YAML integer is taken as that text too (``inline_below: 0``)."""
    def before(value: Any) -> Any:
        if isinstance(value, Size):         # (a value assigned, or a dumped config validated again)
            return value.text
        return str(value) if integers and type(value) is int else value

    return GetPydanticSchema(lambda _source, _handler: core_schema.no_info_before_validator_function(
        before, core_schema.no_info_after_validator_function(check, core_schema.str_schema()),
        serialization=core_schema.plain_serializer_function_ser_schema(_as_written)))


def size_at_least(minimum: int, integers: bool = False) -> GetPydanticSchema:
    """A :class:`Size` field of at least ``minimum`` bytes, written such as 20MB, 1GB or 64MiB."""
    return _size_field(lambda text: _checked_size(text, minimum), integers)


def _dask_memory(text: str) -> str | Size:
    """dask's memory limit of a worker: 'auto' (as written) or a size of at least 1 MiB."""
    return text if text.strip().lower() == "auto" else _checked_size(text, 1 << 20)


#: A size such as 20MB, 1GB or 64MiB, held as a :class:`pipeline.units.Size` (bytes; ``.text`` as written).
AnySize = Annotated[Size, size_at_least(1)]
#: DuckDB's memory for the decoder's joins: below this the joins of the 1 GB synth trace with stack keys
#: failed (16MB: out of memory; 32MB: decoded), and a 5 MB fixture needed more than 8MB.
JOIN_MEMORY_MIN = 32 << 20
#: The same floor for the aggregate sections' DuckDB.
AGGREGATE_MEMORY_MIN = 32 << 20


class Section(BaseModel):
    # (validate_default: a default written as text, "64MB", is held as what the field makes of it, a Size)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


class ClusterConfig(Section):
    mode: Literal["local", "address", "synchronous"] = Field(
        "local",
        description="local: start a dask LocalCluster on 127.0.0.1 for the command; address: connect to a running "
        "dask scheduler (`address`, or `scheduler_file`: workers that stay between commands are dask's own, "
        "`dask scheduler --scheduler-file F` and `dask worker --scheduler-file F`); synchronous: no dask at all, "
        "tasks run in this process (for debugging).",
    )
    address: str | None = Field(None, description="Scheduler address (tcp://host:8786) when mode is 'address'.")
    scheduler_file: str | None = Field(None, description="When mode is 'address' and no address is given: the "
                                       "file a dask scheduler wrote its address to (`dask scheduler --scheduler-file`).")
    n_workers: int | None = Field(None, ge=1, description="Worker processes for mode 'local'; default: one per core.")
    threads_per_worker: int = Field(1, ge=1, description="Threads per worker process (numba kernels hold the GIL-free loops).")
    memory_limit: Annotated[str | Size, _size_field(_dask_memory)] = Field(
        "4GiB", description="Memory limit per local worker: a size (e.g. '4GiB') or 'auto' (dask's share of the machine).")
    inline_below: Annotated[Size, size_at_least(0, integers=True)] = Field(
        "64MB", description="In mode 'local', inputs (trace or self-profiles) smaller than this run in this process "
        "without starting a cluster: its start (1.2 s of the 2.4 s `bootprof decode` of a 4.4 MB trace) would "
        "cost more than its workers save. The aggregate and report stages weigh only the self-profiles (what they hand "
        "to workers). 0: always start the cluster.")


class DecodeConfig(Section):
    partition_bytes: int = Field(
        24 << 20, ge=1 << 16,
        description="Bytes of ETL buffers handed to one dask task (inflated size for compressed buffers); of a "
        "perf.data file's records, likewise.",
    )
    join_memory_limit: Annotated[Size, size_at_least(JOIN_MEMORY_MIN)] = Field(
        "256MB", description="DuckDB memory limit of the ETL joins that need the whole trace (lifetimes, stack "
        "keys, the stacks table, the heap-snapshot assembly); beyond it DuckDB spills to a temporary directory "
        "inside the stage output. At least 32MiB.",
    )
    bucket_rows: int = Field(
        500_000, ge=10, description="Rows (samples, stack pieces not adopted by a sample, VirtualAlloc and heap events) per time bucket "
        "of the ETL per-event joins; one dask task joins one bucket, so this bounds a worker's memory "
        "(about 150 bytes per row). There are at least as many buckets as workers.",
    )
    max_error_rows: int = Field(10_000, ge=0, description="At most this many rows in the `errors` table per input.")
    skip_cargo_probe: bool = Field(
        True, description="Ignore cargo's tiny probe self-profiles (`___-<pid>.mm_profdata`)."
    )
    cache_dir: Path = Field(
        Path("~/.cache/bootprof/decode"),
        description="Where the perf decoder keeps what it derives from files outside the run, across runs: the "
        "unwind rows of ELF images (`--call-graph dwarf`; by build id, else path, size and time), and the [vdso] "
        "of this machine's kernel.",
    )


class SynthConfig(Section):
    seed: int = Field(1, description="Random seed: the same seed gives byte-identical output.")
    size: AnySize = Field("8MB", description="Approximate trace size (e.g. 20MB, 1GB).")
    cpus: int = Field(4, ge=1, le=2048, description="Logical CPUs of the simulated machine.")
    compress: bool = Field(False, description="Write XPRESS-compressed buffers, as xperf -merge -compress does.")
    pointer_size: Literal[4, 8] = Field(8, description="Pointer size of the simulated system.")
    stack_caching: bool = Field(False, description="Emit stack keys (StackKeyKernel/User + KeyRundown) instead of full StackWalk events.")
    stack_variety: int | None = Field(
        None, ge=1, le=100_000, description="How many call-stack templates the simulated processes draw from, as "
        "a multiple of the smallest set (null: 1 to 8 by size, ~1,100 distinct stacks at 1 GB; 2000: ~250,000, "
        "nearer a real rustc build's).")
    self_profiles: bool = Field(True, description="Also write a rustc self-profile (.mm_profdata) of every rustc "
                                "process into selfprofile/ beside the trace, with query timelines that agree with "
                                "its samples (the truth says which query each sample belongs to).")
    rerun: int = Field(0, ge=0, description="Re-run of the same build: 0 is the build as the seed makes it; any other "
                       "number is that build run again, with run-to-run noise (`noise`) and new sampling.")
    noise: float = Field(0.08, ge=0, le=0.5, description="Relative standard deviation of a 1-second process's work "
                         "from one re-run to the next, and of the whole machine's speed (a smaller process varies "
                         "more: 23 ms of its own on top, as on real builds); re-runs only.")
    inject: list[str] = Field(default_factory=list, description="Changes injected into this run, each "
                              "'crate:NAME:FACTOR' (the rustc of crate NAME works FACTOR times as long), "
                              "'function:NAME:FACTOR' (stacks through function NAME are sampled FACTOR times as often) "
                              "or 'commit:NAME:FACTOR' (VirtualAlloc commits of stacks through NAME are FACTOR times "
                              "as large); NAME as the function reads demangled, e.g. rustc_middle::ty::context::TyCtxt::"
                              "mk_ty_from_kind.")

    @field_validator("inject")
    @classmethod
    def _changes(cls, v: list[str]) -> list[str]:
        for item in v:
            kind, _, rest = item.partition(":")
            name, _, factor = rest.rpartition(":")
            try:
                ok = kind in ("crate", "function", "commit") and name and float(factor) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{item!r}: expected crate:NAME:FACTOR, function:NAME:FACTOR or commit:NAME:FACTOR "
                                 "with FACTOR > 0")
        return v


class SymbolizeConfig(Section):
    symbol_path: str | None = Field(
        None,
        description="Symbol path in _NT_SYMBOL_PATH syntax (dirs, srv*cache*url, cache*dir), ';'-separated. "
        "When unset, the _NT_SYMBOL_PATH environment variable is used.",
    )
    cache_dir: Path = Field(
        Path("~/.cache/bootprof/symbols"),
        description="Where downloaded symbol files and derived lookup tables are cached across runs.",
    )
    download_timeout_s: float = Field(30.0, gt=0, description="Timeout of each socket operation of a symbol server "
                                      "request (connecting, each read).")
    download_deadline_s: float = Field(600.0, gt=0, description="Wall-clock limit of one symbol file's download; "
                                       "a server that trickles is given up on after it.")
    download_max_bytes: AnySize = Field(
        "4GiB", description="Largest symbol file downloaded (a larger body is refused, never read into memory).")
    redirect_hosts: list[str] = Field(
        default_factory=list, description="Hosts a symbol server may redirect to (fnmatch patterns such as "
        "'*.blob.core.windows.net'); a redirect to any other host is refused. The server's own host is allowed.")


class AggregateConfig(Section):
    top_n: int = Field(200, ge=1, description="Rows kept in the top-N summary tables.")
    memory_limit: Annotated[Size, size_at_least(AGGREGATE_MEMORY_MIN)] = Field(
        "4GB", description="DuckDB memory limit of the aggregate stage, shared evenly by its sections (they run at "
        "once); beyond it joins and sorts spill to a temporary directory inside the run directory. At least 32MiB.",
    )
    etl_join_tolerance_ms: float = Field(
        2000.0, ge=0, description="Self-profile to ETL process join: largest start-time difference "
        "(self-profile start_time vs ETL process start) still counted as the same process.",
    )


class ReportConfig(Section):
    title: str = Field("bootprof report", description="Title of the HTML report.")
    top_n: int = Field(50, ge=1, description="Rows shown per table in the HTML report.")
    trace_max_events: int = Field(
        500_000, ge=1000, description="profile_queries.html: at most this many events per process; when a "
        "process has more, the shortest are left out (their time stays in their parent's self time).",
    )
    chrome_trace_min_us: int = Field(
        0, ge=0, description="chrome_trace.json: leave out intervals shorter than this many microseconds "
        "(as crox --minimum-duration); 0 keeps every interval.",
    )


class VerdictConfig(Section):
    window: int = Field(14, ge=1, description="Nights before the judged one whose median is its baseline.")
    z_confident: float = Field(3.8, gt=0, description="|z| from which a change past the floors is a regression or "
                               "an improvement (one night).")
    z_suspect: float = Field(3.0, gt=0, description="|z| from which a change past the floors is a suspect.")
    z_each: float = Field(1.5, ge=0, description="A lasting change: each of two nights past this |z| the same way...")
    z_lasting: float = Field(3.7, gt=0, description="... and their z together (sum over sqrt(2), less the shared "
                             "baseline) past this: a regression seen twice.")
    floor_relative: float = Field(0.05, ge=0, description="Smallest relative change worth a verdict.")
    min_nights: int = Field(2, ge=1, description="Nights of an item's history before a change of it can be a "
                            "regression or an improvement (before: a suspect at most).")
    prior: dict[str, list[float]] = Field(
        default_factory=lambda: {"build time": [0.106, 0.0], "build memory": [0.071, 0.0],
                                 "crate time": [0.106, 16e6], "crate memory": [0.071, float(6 << 20)]},
        description="Per family, the noise of one night when no history says otherwise: [a, b], the standard "
        "deviation of a log value sqrt(a^2 + (b / size)^2) (b in the metric's unit: ns, bytes). `bootprof warehouse "
        "calibrate` fits them to a warehouse's history.")
    prior_weight: float = Field(4.0, ge=0, description="How many nights of history the prior is worth.")
    pool_weight: float = Field(24.0, ge=0, description="The most the residuals of items of similar size are worth.")
    drift_lags: list[int] = Field([7, 14, 21, 28], description="A drift: the last `drift_nights` nights against as "
                                  "many this many nights back.")
    drift_nights: int = Field(5, ge=2, description="Nights on each side of a drift comparison.")


class WarehouseConfig(Section):
    path: Path = Field(Path("runs/warehouse.duckdb"), description="DuckDB file that holds every ingested run "
                       "(relative paths are relative to the working directory).")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Labels stored with each run this config ingests (e.g. machine: ci-win-1, "
        "branch: master, workload: stage2-x86_64-msvc); `bootprof warehouse ingest --label k=v` adds more. A "
        "'workload' label names what was built (runs compare only within a job and workload).",
    )
    lock_timeout_s: float = Field(300.0, gt=0, description="How long a connection waits for another process's "
                                  "lock on the warehouse (an ingest beside another) before it fails.")
    budget_pct: float = Field(5.0, ge=0, description="`warehouse compare` exits 1 when a significant regression is "
                              "at least this many percent (a nightly job fails on it).")
    verdict: VerdictConfig = Field(default_factory=VerdictConfig, description="What a night's verdict rests on "
                                   "(pipeline/warehouse/history.py); `bootprof warehouse calibrate` fits it.")


class RunsConfig(Section):
    mirror_dir: str = Field(
        "~/.cache/bootprof/runs", description="A run directory given as a URL (`--run s3://...`): where commands keep "
        "its working copy, one directory per URL. With cluster.mode 'address' the workers write there too: it must "
        "then be on a filesystem they share, at the same path.")
    mirror_max_bytes: AnySize = Field(
        "20GB", description="Working copies together beyond this size are removed once put back, the least recently "
        "used first (never the command's own, one used in the last hour, or one holding what is not put back yet).")
    lock_timeout_s: float = Field(300.0, ge=0, description="How long a command waits for another that works in the "
                                  "same run directory (one command at a time owns a run directory) before it fails, "
                                  "naming the other.")


class Config(Section):
    cluster: ClusterConfig = ClusterConfig()
    decode: DecodeConfig = DecodeConfig()
    synth: SynthConfig = SynthConfig()
    symbolize: SymbolizeConfig = SymbolizeConfig()
    aggregate: AggregateConfig = AggregateConfig()
    report: ReportConfig = ReportConfig()
    warehouse: WarehouseConfig = WarehouseConfig()
    runs: RunsConfig = RunsConfig()

    def resolved(self) -> dict[str, Any]:
        """Plain JSON form with every default filled in, as stored in manifests."""
        return self.model_dump(mode="json")

    def hash(self) -> str:
        return canonical_hash(self.resolved())


class Job(Section):
    """A job file in ``jobs/``: which stages run, with which config, on what."""

    @field_validator("runs_dir", mode="before")
    @classmethod
    def _runs_dir(cls, value: Any) -> Any:
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        if isinstance(value, str) and value.lower().startswith(("http://", "https://")):
            raise ValueError("runs are written, and HTTP(S) is read-only here: give a path or a store's URL "
                             "(s3://, gs://, abfs://, ...)")
        return value

    @field_validator("stages")
    @classmethod
    def _stages(cls, value: list[str]) -> list[str]:
        from pipeline import stages

        unknown = [s for s in value if s not in stages.job_steps()]
        if unknown:
            raise ValueError(f"no stage {unknown[0]!r} (a job's stages: {', '.join(stages.job_steps())})")
        return value

    def run_dir(self, name: str):
        """Run ``name`` of this job: a path below ``runs_dir``, or a URL below it."""
        from pipeline import sources
        from pipeline.runs import RunLocation

        base = self.runs_dir.rstrip("/") or "/"
        return sources.run_dir(f"{base}/{name}") if sources.URL.match(base) else RunLocation(path=Path(base) / name)

    name: str = Field(description="Job name, used in run directory names: letters, digits, '.', '_' and '-', not "
                      "starting with '.' (a run directory stays inside runs_dir).", pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$",
                      max_length=100)
    config: Path | None = Field(None, description="Config file; a relative path is relative to the directory above the "
                                "job file's (`configs/` beside `jobs/`), else to the working directory; `--config` "
                                "overrides it.")
    stages: list[str] = Field(
        description="Stages in order. 'synth' makes the demo trace for `bootprof run --demo`; 'compare' (after "
        "'warehouse') compares the run with its baseline and fails the job on a regression past the budget."
    )
    runs_dir: str = Field("runs", description="Where run directories are created: a path (relative to the working "
                          "directory), or a store's URL (s3://bucket/runs, ...) that runs are kept at (see `runs`).")
    backfill: bool = Field(False, description="Each --trace (or each ETL trace in a --trace directory) is its own run, "
                           "in <runs_dir>/<name>-<trace name>; a trace that fails is reported and the others still run.")


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """Line (1-based) of the YAML node at key path ``loc``, or of the deepest existing parent."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == key), None)
            if child is None:
                key_node = next((k for k, v in node.value if k.value == key), None)
                return key_node.start_mark.line + 1 if key_node is not None else line
            node = child
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        line = node.start_mark.line + 1
    return line


#: Bounds of a config or job file: its size, and the nodes and nesting of what it holds once its aliases are
#: expanded (a 366-byte file of nested aliases, "billion laughs", stands for 10^9 nodes).
MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64


def _expanded(node: yaml.Node, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(nodes, depth) of ``node`` with its aliases expanded, each shared node counted once per use."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = (MAX_YAML_NODES + 1, MAX_YAML_DEPTH + 1)     # (a node that holds itself is past every bound)
    nodes, depth = 1, 1
    children = ([v for pair in node.value for v in pair] if isinstance(node, yaml.MappingNode)
                else node.value if isinstance(node, yaml.SequenceNode) else [])
    for child in children:
        n, d = _expanded(child, memo)
        nodes, depth = nodes + n, max(depth, d + 1)
        if nodes > MAX_YAML_NODES:
            break
    memo[key] = (nodes, depth)
    return memo[key]


def parse_yaml(text: str, where: str) -> tuple[Any, yaml.Node | None]:
    """YAML text as data (and its node tree, for line numbers), within the bounds above; ConfigError naming
    ``where`` otherwise."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            nodes, depth = _expanded(node, {})
            if nodes > MAX_YAML_NODES or depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{where}: more than {MAX_YAML_NODES:,} values or {MAX_YAML_DEPTH} levels of "
                                  "nesting once its aliases are expanded: not a config")
        return yaml.safe_load(text), node
    except RecursionError:
        raise ConfigError(f"{where}: nested more than the YAML reader can follow: not a config") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None


def _load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes, more than a config or job file holds ({MAX_YAML_BYTES:,})")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    return parse_yaml(text, str(path))


def _validate(model: type[Section], path: Path, data: Any, node: yaml.Node | None):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            key = ".".join(str(p) for p in loc) or "(top level)"
            line = _line_of(node, loc)
            where = f"{path}:{line}" if line else str(path)
            got = "" if err["type"] == "missing" else f" (got {err.get('input')!r})"
            msg = err["msg"].removeprefix("Value error, ")     # (pydantic's prefix for a check's own message)
            lines.append(f"{where}: {key}: {msg}{got}")
        raise ConfigError("invalid configuration\n  " + "\n  ".join(lines)) from None


def load_config(path: Path | str | None = None) -> Config:
    """Load and validate a config file; ``None`` gives the defaults."""
    if path is None:
        return Config()
    path = Path(path)
    data, node = _load_yaml(path)
    return _validate(Config, path, data, node)


def load_job(path: Path | str) -> Job:
    path = Path(path)
    data, node = _load_yaml(path)
    return _validate(Job, path, data, node)

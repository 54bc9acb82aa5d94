"""What crosses a module line, typed: a stage output's manifest, each stage's summary (its part of the manifest and
its line in a job's output), the rows of the decode's errors table, and a comparison of two runs.

They are ``TypedDict``\\ s: the JSON a run directory and the warehouse hold, as they are, with names and types a
reader and a checker can see. :func:`pipeline.runs.read_manifest` validates a manifest's common part
(:data:`MANIFEST`) as it reads one, so a damaged or foreign manifest is refused in one line that names the file;
``tests/test_contracts.py`` checks every stage's manifest of real runs against its type, both ways (a key the type
does not declare fails too).

``dict[str, Any]`` stays where JSON is passed on whole: the resolved config, a store's answer, a table's rows.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import NotRequired, Required, TypedDict  # (pydantic reads these on Python 3.11)

from pydantic import TypeAdapter

from pipeline.stages import AGGREGATED, COMPARED, DECODED, REPORTED, SYMBOLIZED

# ---------------------------------------------------------------------------------------------------------- manifest


class InputRecord(TypedDict, total=False):
    """One input a stage read: a file or URL (:func:`pipeline.sources.fingerprint`), or an upstream output."""

    path: Required[str]
    size: int | None
    sha256_tree: str | None     # (:func:`pipeline.runs.sha256_tree`; None for a URL, whose store has a version)
    version: str | None         # a URL's version as its store says it
    error: str                  # why a local file could not be read (the decode skipped and counted it)
    stage: str                  # an upstream output's stage, and when it was made
    created_utc: str | None


class Manifest(TypedDict):
    """What every stage output's ``_manifest.json`` holds (:func:`pipeline.runs.stage_output`); each stage adds its
    summary (``DecodedManifest`` and the others below)."""

    schema_version: int
    project_version: str
    stage: str
    created_utc: str
    output_id: NotRequired[str]     # this write's own identity (a uuid4): no two writes' manifests hash alike
    elapsed_s: float
    inputs: list[InputRecord]
    config: dict[str, Any]      # the resolved config (JSON: :meth:`pipeline.config.Config.resolved`)
    config_hash: str
    upstream: dict[str, str]    # upstream output -> the hash of the manifest it was made from
    tables: dict[str, int]      # table -> rows


#: Validates a manifest's common part (a stage's own keys pass unread: pydantic drops them from what it returns).
MANIFEST = TypeAdapter(Manifest)

# ------------------------------------------------------------------------------------------------------------ decode


class ErrorRow(TypedDict):
    """A row of ``decoded/errors``: one problem in an input, where it is, and the sentence that says it."""

    file: str
    buffer_index: int           # -1: not in a buffer (a heap snapshot, the file's header)
    file_offset: int            # -1: no place in the file
    record_offset: int          # into the buffer's event data (-1: the buffer as a whole)
    kind: str
    message: str


class EtlCounts(TypedDict, total=False):
    """What the decode of one ETL trace counted (:func:`pipeline.decode.etl.decode_etl`)."""

    file: str
    records: int
    errors: int
    samples: int
    samples_with_stack: int
    samples_with_stack_records: int
    samples_adopted_stacks: int
    samples_settled_by_keys: int
    samples_final_in_partitions: int
    stacks: int
    stack_keys: int
    stack_keys_unresolved: int
    stack_id_collisions: int
    adopted_stacks_rejoined: int
    heap_snapshots: int
    heap_snapshots_incomplete: int
    heap_events_final_in_partitions: int
    events_lost: int
    buffers_total: int
    buffers_lost: int
    buffers_missing: int
    buffers_skipped: int
    buffers_compressed: int
    bytes_resynced: int
    bucket_rows_lost: int
    partitions: int
    join_buckets: int
    walk_reads: str
    walk_s: float
    partitions_s: float
    join_s: float
    join_phases_s: dict[str, float]
    decode_s: float
    cluster_wait_s: float
    mb_per_s: float


class SelfProfileCounts(TypedDict, total=False):
    """What the decode of a run's self-profiles counted (:func:`pipeline.decode.measureme.decode_profiles`)."""

    files: int
    decoded: int
    skipped: int
    errors: int
    error_messages: list[str]
    events: int
    elapsed_s: float


class PerfCounts(TypedDict, total=False):
    """What the decode of one perf.data file counted (:func:`pipeline.decode.perf.decode_perf`)."""

    file: str
    file_size: int
    records: int
    samples: int
    samples_with_stack: int
    stacks: int
    stack_id_collisions: int
    processes: int
    threads: int
    images: int
    images_inherited: int
    build_ids: int
    errors: int
    lost_events: int
    lost_samples: int
    bytes_skipped: int
    resyncs: int
    origin_unix_ns: int | None          # Unix time of timestamp_ns 0 (perf's CLOCK_DATA), None without
    dwarf_unwind: dict[str, Any]        # --call-graph dwarf: images with CFI, rows, frames unwound (decode/perf/unwind.py)
    command_lines_from_profiles: int     # processes named by a self-profile of the same decode
    profiles_unmatched: int              # self-profiles that named no process of the recording
    parts: int                           # parts of the data section decoded as tasks (decode.partition_bytes)
    walk_s: float                        # until the parts were decoded (the walks and the DWARF unwind)
    decode_s: float
    tables_s: float
    mb_per_s: float


class DecodeSummary(TypedDict, total=False):
    etl: EtlCounts
    perf: PerfCounts
    self_profile: SelfProfileCounts
    hash_wait_s: float          # what the decode waited for its inputs' hashes after it was done


class DecodedManifest(Manifest, DecodeSummary):
    errors_total: NotRequired[int]      # errors found (the errors table keeps the first ``decode.max_errors``)


# --------------------------------------------------------------------------------------------------------- symbolize


class ModuleRate(TypedDict):
    frames: int
    resolved: int
    rate: float


class MissingSymbols(TypedDict):
    module: str
    debug_id: str | None
    pdb_name: str | None
    reason: str
    frames: int


class ImageIdentity(TypedDict, total=False):
    """What names an image's symbols (:func:`pipeline.symbolize.image_debug_ids`): a PDB identity from the trace's
    DbgID record (``debug_id``, ``guid``, ``age``, ``pdb_name``), or a binary to fetch first (``code_file``,
    ``code_key``); ``key`` is what the lookup task is keyed by."""

    key: Required[str]
    debug_id: Required[str | None]
    pdb_name: Required[str | None]
    guid: str
    age: int
    code_file: str
    code_key: str
    elf_path: str           # a Linux image (pipeline.symbolize.elf): the mapped file, and its build id if known
    build_id: str | None
    kernel: bool            # the kernel of a perf run
    bundled: str            # the run's own copy of the ELF file (capture --perf --symbols), read before elf_path


class SymbolLookup(TypedDict, total=False):
    """What the lookup of one identity found (:func:`pipeline.symbolize.build.resolve_debug_id`); the address table
    itself stays in the cache, at ``table_dir``."""

    key: Required[str]
    debug_id: str | None
    pdb_name: str | None
    status: str                 # ok or missing
    reason: str                 # why it is missing
    tried: list[str]            # where it was looked for (the first 20)
    requests: int               # HTTP requests made
    cached: bool
    kind: str | None            # the table's source: pdb, breakpad, pdb-publics, pe-exports, ...
    source: str                 # the symbol file it was made from
    found_via: str              # the symbol path entry it came from
    table_dir: str
    image_size: int | None
    layout: str | None
    functions: int
    ranges: int
    code_file: str
    binary: str
    learned_debug_id: str       # the PDB identity a fetched binary named
    elapsed_s: float


class SymbolizeSummary(TypedDict, total=False):
    frames: int
    rows: int
    resolved_frames: int
    resolution_rate: float
    images_without_symbols: int
    skipped: str                # why there was nothing to resolve


class SymbolizedManifest(Manifest, total=False):
    frames: int
    resolved_frames: int
    resolution_rate: float
    modules: dict[str, ModuleRate]
    images_without_symbols: list[MissingSymbols]
    symbol_path: str
    cache_dir: str
    symbolic_missing: str | None
    debug_ids: list[SymbolLookup]       # one each, as its task reported it (but ``tried``)
    http_requests: int
    reused_range_frames: int
    stack_sources: dict[str, int]
    timings_s: dict[str, float]
    skipped: str


# --------------------------------------------------------------------------------------------------------- aggregate


class TimeBins(TypedDict):
    t0_ns: int
    span_ns: int
    count: int


class CpuCounts(TypedDict, total=False):
    samples: int
    samples_with_stack: int
    samples_leaf_in_image: int
    processes: int
    units: int
    symbolized: bool
    time_bins: TimeBins


class MemoryCounts(TypedDict, total=False):
    commits: int
    frees: int
    frees_unmatched: int
    commit_bytes: int
    returned_bytes: int
    outstanding_bytes: int
    peak_commit_bytes: int
    peak_ns: int
    commit_frames_unresolved: int
    commit_time_bins: TimeBins
    heap_snapshots: int
    heap_snapshots_not_ok: int
    heap_snapshot_pairs: int
    heap_frames_unresolved: int


class ProcessCounts(TypedDict, total=False):
    processes: int
    roots: int
    ended: int
    parent_cycles_broken: int


class QueryCounts(TypedDict, total=False):
    files: int
    crates: int
    labels: int
    stacks: int
    etl_matched: int | None     # self-profiles matched to a process of the trace (None: no trace)


class QueryCpuCounts(TypedDict, total=False):
    samples: int
    processes: int
    thread_pairs: int
    in_queries: int
    outside_queries: int
    unprofiled_threads: int


class AggregateSections(TypedDict, total=False):
    """The aggregate's sections that ran (one that had no data for it is absent)."""

    queries: QueryCounts
    cpu: CpuCounts
    memory: MemoryCounts
    processes: ProcessCounts
    query_cpu: QueryCpuCounts


#: The aggregate's summary: its sections' counts.
AggregateSummary = AggregateSections


class SectionTimings(TypedDict):
    """Where an aggregate section's time went (:mod:`pipeline.timings`): its seconds, and those of its largest
    statements (``create cs_funcs``, ``copy cpu_by_function``) and waits (``wait symbolized``), the rest as ``other``."""

    seconds: float
    steps: dict[str, float]


class AggregatedManifest(Manifest):
    sections: AggregateSections
    timings: dict[str, SectionTimings]      # by section


# ------------------------------------------------------------------------------------------------------------ report


class Peak(TypedDict, total=False):
    at_ns: int
    bytes: int
    pid: int | None
    process: str | None
    process_at_ns: int | None
    process_bytes: int | None


class BuildFacts(TypedDict):
    """What the top of ``index.html`` says (:func:`pipeline.report.summary.facts`); the top-5 lists are rows of the
    aggregated tables (JSON)."""

    wall_ns: int | None
    cpu_ns: int | None
    cpu_samples: int | None
    busy_cores: float | None
    processes: dict[str, int]           # rustc processes by stage
    peak: Peak | None
    crates_wall: list[dict[str, Any]]
    crates_cpu: list[dict[str, Any]]
    functions: list[dict[str, Any]]
    queries: list[dict[str, Any]]
    critical: list[dict[str, Any]]


#: A report section's summary: its counts (and, in the manifest, the ``files`` it wrote), by section id.
ReportSummary = dict[str, dict[str, object]]


class ReportTimings(TypedDict):
    seconds: float | None


class ReportedManifest(Manifest):
    sections: ReportSummary
    timings: dict[str, ReportTimings]       # by section id: what it took


# ---------------------------------------------------------------------------------------------- warehouse and compare


class IngestSummary(TypedDict):
    run_id: str
    db: str
    tables: int
    rows: int


class ComparisonRow(TypedDict):
    """One metric of a run against its baseline, judged (a row of the warehouse's ``verdicts`` table;
    :func:`pipeline.warehouse.comparison.judge`)."""

    run_id: str
    baseline_run_id: str
    kind: str
    test: str
    family: str
    role: str
    key: str
    baseline_value: float
    value: float
    change: float
    relative_change: float | None
    reference: float | None
    adjusted_change: float | None
    noise: float | None
    z: float | None
    threshold: float | None
    history: int
    pooled: float
    confidence: str
    verdict: str                # regression, suspect, improvement or noise
    decides: bool
    impact: NotRequired[float]  # its change as a share of its kind's baseline total


class Member(TypedDict):
    kind: str
    relative_change: float | None
    adjusted_change: float | None
    z: float | None
    verdict: str


class Family(ComparisonRow):
    """A voting family (a crate's time, the build's): the row of the member that decides it, and all members."""

    members: list[Member]


class Comparison(TypedDict):
    """A run against its baseline (:func:`pipeline.warehouse.compare`)."""

    run_id: str
    job: str | None
    workload: str | None
    baseline_run_id: str | None         # None: nothing to compare with (``reason`` says why)
    reason: str | None
    verdict: str                        # regression, suspect, improvement or no change
    headline: list[ComparisonRow]
    families: list[Family]
    changes: list[ComparisonRow]
    explanations: dict[str, list[dict[str, Any]]]   # crate -> the queries that grew most (rows of a query)


class CompareSummary(TypedDict):
    baseline_run_id: str | None
    reason: str | None
    verdict: str
    regressions: int
    suspects: int
    improvements: int
    regressions_past_budget: int
    budget_pct: float
    regressed: list[str]
    suspected: list[str]


class ComparedManifest(Manifest, CompareSummary):
    pass


#: Each stage output's manifest type, by output directory (what ``tests/test_contracts.py`` checks runs against).
MANIFESTS: dict[str, type] = {DECODED: DecodedManifest, SYMBOLIZED: SymbolizedManifest,
                              AGGREGATED: AggregatedManifest, REPORTED: ReportedManifest, COMPARED: ComparedManifest}

#: A stage's summary, as ``run`` returns it and ``headline`` shows it (the job runner passes it on as it is).
Summary = (DecodeSummary | SymbolizeSummary | AggregateSummary | ReportSummary | IngestSummary | CompareSummary
           | dict[str, object])

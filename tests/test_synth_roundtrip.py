"""Synthesized traces decoded by OUR decoder (``pipeline.decode``), compared with the ground truth exactly:
samples per process / stack / function / crate, commit per stack, heap events, outstanding heap bytes per
snapshot, the process tree, images and per-kind counts. Every variant: compressed and not, 4- and 8-byte
pointers, full StackWalk stacks and stack caching.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from pipeline.synth.records import KINDS

MEM_COMMIT = 0x1000


def _table(synth_decoded, s, name):
    tables = synth_decoded[s.name]["tables"]
    assert name in tables, f"the decoder wrote no '{name}' table for {s.path}"
    return tables[name]


def _template_of(synth_decoded, s):
    """decoded stack_id -> truth stack template id (by frames, leaf first)."""
    by_frames = {tuple(int(x, 16) for x in st["frames"]): k for k, st in s.truth["stacks"].items()}
    return {row["stack_id"]: by_frames.get(tuple(row["frames"]), f"unknown:{row['stack_id']}")
            for row in _table(synth_decoded, s, "stacks")}


def test_process_tree(synth_trace, synth_decoded):
    rows = _table(synth_decoded, synth_trace, "processes")
    got = {(r["pid"], r["parent_pid"], r["image_name"], r["command_line"], r["start_ns"], r["end_ns"])
           for r in rows if r["start_ns"] is not None}
    want = {(q["pid"], q["parent_pid"], q["image_name"], q["command_line"], q["start_ns"], q["end_ns"])
            for q in synth_trace.truth["processes"] if not q["rundown"]}
    assert got == want
    rundown = {q["pid"] for q in synth_trace.truth["processes"] if q["rundown"]} | {0, 4}
    assert rundown <= {r["pid"] for r in rows if r["start_ns"] is None}


def test_images(synth_trace, synth_decoded):
    rows = _table(synth_decoded, synth_trace, "images")
    t = synth_trace.truth
    by_path = {im["path"]: im for im in t["images"]}
    got = Counter((r["pid"], r["base"], r["size"], r["file_name"]) for r in rows)
    want = Counter((q["pid"], int(by_path[path]["base"], 16), by_path[path]["size"], path)
                   for q in t["processes"] for path in q["image_paths"])
    kernel = next(im for im in t["images"] if im["kernel"])
    want[(0, int(kernel["base"], 16), kernel["size"], kernel["path"])] += 1
    assert got == want
    loads = Counter((r["pid"], r["base"], r["file_name"], r["load_ns"], r["unload_ns"]) for r in rows
                    if r["load_ns"] is not None)
    assert loads == Counter((im["pid"], int(im["base"], 16), im["path"], im["load_ns"], im["unload_ns"])
                            for im in t["image_loads"] if not im["rundown"])


def test_samples_per_process_and_stack(synth_trace, synth_decoded):
    t = synth_trace.truth
    rows = _table(synth_decoded, synth_trace, "samples")
    assert len(rows) == t["samples"]["total"]
    per_pid = Counter(r["pid"] for r in rows)
    want = Counter()
    for q in t["samples"]["per_process"]:
        want[q["pid"]] += q["samples"]
    want[0] += t["samples"]["idle"]
    assert per_pid == want
    tmpl = _template_of(synth_decoded, synth_trace)
    per_stack = Counter(tmpl.get(r["stack_id"], "no stack") for r in rows)
    assert dict(per_stack) == t["samples"]["per_stack"]
    assert all(r["ip"] == int(t["stacks"][tmpl[r["stack_id"]]]["frames"][0], 16) for r in rows)


def test_samples_per_function(synth_trace, synth_decoded):
    t = synth_trace.truth
    tmpl = _template_of(synth_decoded, synth_trace)
    fself, fincl = Counter(), Counter()
    for r in _table(synth_decoded, synth_trace, "samples"):
        funcs = t["stacks"][tmpl[r["stack_id"]]]["functions"]
        fself[funcs[0]] += 1
        fincl.update(set(funcs))
    assert {k: v["self"] for k, v in t["samples"]["per_function"].items() if v["self"]} == dict(fself)
    assert {k: v["inclusive"] for k, v in t["samples"]["per_function"].items()} == dict(fincl)


def test_commit_per_stack(synth_trace, synth_decoded):
    t = synth_trace.truth
    tmpl = _template_of(synth_decoded, synth_trace)
    rows = _table(synth_decoded, synth_trace, "virtual_allocs")
    commit = defaultdict(lambda: {"commit_bytes": 0, "allocs": 0})
    for r in rows:
        if r["kind"] == "alloc" and r["flags"] & MEM_COMMIT:
            c = commit[tmpl.get(r["stack_id"], "no stack")]
            c["commit_bytes"] += r["size"]
            c["allocs"] += 1
    assert dict(commit) == t["commit"]["per_stack"]
    assert sum(r["size"] for r in rows if r["kind"] != "alloc") == t["commit"]["released_bytes"]


def test_heap_events(synth_trace, synth_decoded):
    t = synth_trace.truth
    rows = _table(synth_decoded, synth_trace, "heap_events")
    assert dict(Counter(r["kind"] for r in rows)) == t["heap"]["events"]
    tmpl = _template_of(synth_decoded, synth_trace)
    heap_stacks = {k for k, st in t["stacks"].items() if st["functions"][0].endswith("RtlpLogHeapAllocateEvent")}
    for r in rows:
        if r["kind"] in ("alloc", "realloc"):
            assert tmpl.get(r["stack_id"]) in heap_stacks
        else:
            assert r["stack_id"] is None


def test_heap_snapshots_outstanding_bytes(synth_trace, synth_decoded):
    """Outstanding bytes per stack at each snapshot. Snapshots are told apart by (pid, instance, time):
    a reused PID restarts the per-process instance counter at 1 (heap-snapshot.md §1)."""
    t = synth_trace.truth
    tmpl = _template_of(synth_decoded, synth_trace)
    blocks = _table(synth_decoded, synth_trace, "heap_snapshot_blocks")
    snaps = _table(synth_decoded, synth_trace, "heap_snapshots")
    assert sorted((r["pid"], r["instance"], r["timestamp_ns"]) for r in snaps) == \
        sorted((s["pid"], s["instance"], s["timestamp_ns"]) for s in t["heap"]["snapshots"])
    got = defaultdict(lambda: defaultdict(int))
    untracked = defaultdict(int)
    for b in blocks:
        key = (b["pid"], b["instance"], b["timestamp_ns"])
        if b["stack_id"] is None:
            untracked[key] += b["size"]
        else:
            got[key][tmpl.get(b["stack_id"], "unknown")] += b["size"]
    want = {(s["pid"], s["instance"], s["timestamp_ns"]): {k: v["bytes"] for k, v in s["per_stack"].items()}
            for s in t["heap"]["snapshots"]}
    want_untracked = {(s["pid"], s["instance"], s["timestamp_ns"]): s["untracked_bytes"]
                      for s in t["heap"]["snapshots"]}
    assert {k: dict(v) for k, v in got.items()} == {k: v for k, v in want.items() if v}
    assert dict(untracked) == want_untracked


def test_event_counts(synth_trace, synth_decoded):
    rows = _table(synth_decoded, synth_trace, "event_counts")
    kind_of = {(guid, op): name for name, (guid, op, _) in KINDS.items()}
    got = Counter()
    for r in rows:
        op = r["event_id"] if r["provider_guid"] == KINDS["HeapSnapshot.Chunk"][0] else r["opcode"]
        got[kind_of.get((r["provider_guid"], op), f"{r['provider_guid']}/{op}")] += r["count"]
    assert dict(got) == {k: v for k, v in synth_trace.truth["event_counts"].items() if v}

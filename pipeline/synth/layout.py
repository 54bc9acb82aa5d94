"""Byte layouts the synthesizer WRITES, declared once from ``../shared/docs/etl-format.md`` and
``../shared/docs/heap-snapshot.md``.

Deliberately independent of ``pipeline/decode``: a layout bug copied into both would pass every
roundtrip test, so the synthesizer has its own declarations and is cross-checked against dissect.etl.
All integers are little-endian. Record headers are declared as packed numpy dtypes; fixed-size
payloads as dtypes per pointer size (``P`` = 4 or 8); ``test_synth_layout.py`` checks every size
against the format notes.
"""

from __future__ import annotations

import uuid

import numpy as np

# --- buffers (etl-format §1.2) -------------------------------------------------------------------
BUFFER_HEADER = np.dtype([
    ("BufferSize", "<u4"), ("SavedOffset", "<u4"), ("CurrentOffset", "<u4"), ("ReferenceCount", "<i4"),
    ("TimeStamp", "<i8"), ("SequenceNumber", "<i8"), ("ClockFreq", "<u8"),
    ("ProcessorIndex", "<u2"), ("LoggerId", "<u2"), ("State", "<u4"), ("Offset", "<u4"),
    ("BufferFlag", "<u2"), ("BufferType", "<u2"), ("Padding", "V16"),
])
BUFFER_HEADER_SIZE = 0x48
BUFFER_FLAG_FLUSH_MARKER = 0x0001
BUFFER_FLAG_PROC_INDEX = 0x0020
BUFFER_FLAG_COMPRESSED = 0x0040
BUFFER_TYPE_GENERIC = 0
BUFFER_TYPE_HEADER = 4
BUFFER_STATE_FLUSH = 3
RECORD_ALIGN = 8
SESSION_BUFFER_SIZE = 0x10000          # uncompressed capacity of every data buffer
HEADER_BUFFER_SIZE = 0x400             # relogged files truncate buffer 0

LOG_MODE_SEQUENTIAL = 0x00000001
LOG_MODE_RELOG = 0x00010000
LOG_MODE_COMPRESSED = 0x04000000

# --- record headers (etl-format §2) --------------------------------------------------------------
MARKER_FLAGS = 0xC0
# header type byte per pointer size
HT_SYSTEM = {4: 0x01, 8: 0x02}
HT_PERFINFO = {4: 0x10, 8: 0x11}
HT_FULL = {4: 0x0A, 8: 0x14}
HT_EVENT = {4: 0x12, 8: 0x13}

SYSTEM_HEADER = np.dtype([
    ("Version", "<u2"), ("HeaderType", "u1"), ("MarkerFlags", "u1"), ("Size", "<u2"), ("HookId", "<u2"),
    ("ThreadId", "<u4"), ("ProcessId", "<u4"), ("SystemTime", "<i8"), ("KernelTime", "<u4"), ("UserTime", "<u4"),
])
PERFINFO_HEADER = np.dtype([
    ("Version", "<u2"), ("HeaderType", "u1"), ("MarkerFlags", "u1"), ("Size", "<u2"), ("HookId", "<u2"),
    ("SystemTime", "<i8"),
])
FULL_HEADER = np.dtype([
    ("Size", "<u2"), ("HeaderType", "u1"), ("MarkerFlags", "u1"), ("Type", "u1"), ("Level", "u1"),
    ("Version", "<u2"), ("ThreadId", "<u4"), ("ProcessId", "<u4"), ("TimeStamp", "<i8"), ("Guid", "V16"),
    ("KernelTime", "<u4"), ("UserTime", "<u4"),
])
EVENT_HEADER = np.dtype([
    ("Size", "<u2"), ("HeaderType", "u1"), ("MarkerFlags", "u1"), ("Flags", "<u2"), ("EventProperty", "<u2"),
    ("ThreadId", "<u4"), ("ProcessId", "<u4"), ("TimeStamp", "<i8"), ("ProviderId", "V16"),
    ("Id", "<u2"), ("Version", "u1"), ("Channel", "u1"), ("Level", "u1"), ("Opcode", "u1"), ("Task", "<u2"),
    ("Keyword", "<u8"), ("KernelTime", "<u4"), ("UserTime", "<u4"), ("ActivityId", "V16"),
])

# --- hook ids (Group << 8 | Type) and versions ---------------------------------------------------
HOOK_LOGFILE_HEADER = 0x0000
HOOK_HEADER_EXTENSION, HOOK_RUNDOWN_COMPLETE, HOOK_END_EXTENSION = 0x0005, 0x0008, 0x0020
HEADER_EXTENSION = np.dtype([("GroupMask", "<u4", (8,)), ("KernelEventVersion", "<u4")])
HOOK_PROCESS_START, HOOK_PROCESS_END, HOOK_PROCESS_DCSTART, HOOK_PROCESS_DCEND = 0x0301, 0x0302, 0x0303, 0x0304
HOOK_IMAGE_LOAD = 0x030A
HOOK_THREAD_START, HOOK_THREAD_END, HOOK_THREAD_DCSTART, HOOK_THREAD_DCEND = 0x0501, 0x0502, 0x0503, 0x0504
HOOK_IMAGE_UNLOAD, HOOK_IMAGE_DCSTART = 0x1402, 0x1403
HOOK_SAMPLED_PROFILE = 0x0F2E
HOOK_VIRTUAL_ALLOC, HOOK_VIRTUAL_FREE = 0x0262, 0x0263
HOOK_HEAP_ALLOC, HOOK_HEAP_REALLOC, HOOK_HEAP_FREE = 0x1021, 0x1022, 0x1024
HOOK_STACK = 0x1820
HOOK_STACK_KEY_DELETE, HOOK_STACK_KEY_RUNDOWN = 0x1823, 0x1824
HOOK_STACK_KEY_KERNEL, HOOK_STACK_KEY_USER = 0x1825, 0x1826
HOOK_SYSCONFIG_CPU = 0x0B0A

VERSION_PROCESS = 4
VERSION_THREAD = 3
VERSION_IMAGE = 3
VERSION_PERFINFO = 2          # SampledProfile, StackWalk
VERSION_PAGEFAULT = 2
VERSION_HEAP = 2
VERSION_SYSCONFIG_CPU = 3

MEM_COMMIT, MEM_RESERVE, MEM_DECOMMIT, MEM_RELEASE = 0x1000, 0x2000, 0x4000, 0x8000

# --- KernelTraceControl ImageID records (§3.9): FULL header, Class.Version 2 -----------------------
IMAGE_ID_GUID = uuid.UUID("b3e675d7-2554-4f18-830b-2762732560de")
IMAGE_ID_VERSION = 2
IMAGE_ID_TYPE_INFO = 0
IMAGE_ID_TYPE_DBGID_RSDS = 36

# --- Heap-Snapshot provider (heap-snapshot.md §2, §3) --------------------------------------------
HEAP_SNAPSHOT_GUID = uuid.UUID("901d2afa-4ff6-46d7-8d0e-53645e1a47f5")
HEAP_SNAPSHOT_CHUNK_ID = 100
HEAP_SNAPSHOT_END_ID = 200
HEAP_SNAPSHOT_EVENT_VERSION = 1
HEAP_SNAPSHOT_CHUNK_BYTES = 0x4000
HEAP_SNAPSHOT_CHUNK_PREFIX = np.dtype([("Instance", "<u4"), ("Sequence", "<u4"), ("BufferLen", "<u4")])
HEAP_SNAPSHOT_END = np.dtype([("Instance", "<u4"), ("TotalData", "<u4")])
STACKDB_HEADER = np.dtype([("SegmentCount", "<u4"), ("StackCount", "<u4"), ("Version", "<u2"), ("PointerSize", "<u2")])
STACKDB_VERSION = 1
STACKDB_SEGMENT_FRAMES = 8
HEAP_SECTION_VERSION = 2
SNAPSHOT_SENTINEL_ADDRESS = 0x1234CDEF
SNAPSHOT_SENTINEL_SIZE = 0xFFFFFFFF


def heap_section_header(p: int) -> np.dtype:
    """Per-heap header: 32 bytes on x64 (§3.2); the 16-byte x86 form of §3.3 when P = 4 (inferred)."""
    if p == 8:
        return np.dtype([("Version", "<u2"), ("PointerSize", "<u2"), ("Pad", "<u4"), ("Heap", "<u8"),
                         ("TotalCommit", "<u8"), ("TotalReserve", "<u8")])
    return np.dtype([("Version", "<u2"), ("PointerSize", "<u2"), ("Heap", "<u4"),
                     ("TotalCommit", "<u4"), ("TotalReserve", "<u4")])


def ptr(p: int) -> str:
    return "<u8" if p == 8 else "<u4"


# --- fixed-size payloads ------------------------------------------------------------------------
def sampled_profile(p: int) -> np.dtype:
    return np.dtype([("InstructionPointer", ptr(p)), ("ThreadId", "<u4"), ("Count", "<u2"),
                     ("Flags", "u1"), ("Rank", "u1")])


def stack_key_ref(p: int) -> np.dtype:
    return np.dtype([("EventTimeStamp", "<i8"), ("StackProcess", "<u4"), ("StackThread", "<u4"),
                     ("StackKey", ptr(p))])


STACK_WALK_PREFIX = np.dtype([("EventTimeStamp", "<i8"), ("StackProcess", "<u4"), ("StackThread", "<u4")])


def virtual_alloc(p: int) -> np.dtype:
    return np.dtype([("BaseAddress", ptr(p)), ("RegionSize", ptr(p)), ("ProcessId", "<u4"), ("Flags", "<u4")])


def heap_alloc(p: int) -> np.dtype:
    return np.dtype([("HeapHandle", ptr(p)), ("Size", ptr(p)), ("Address", ptr(p)), ("Source", "<u4")])


def heap_realloc(p: int) -> np.dtype:
    return np.dtype([("HeapHandle", ptr(p)), ("NewAddress", ptr(p)), ("OldAddress", ptr(p)),
                     ("NewSize", ptr(p)), ("OldSize", ptr(p)), ("Source", "<u4")])


def heap_free(p: int) -> np.dtype:
    return np.dtype([("HeapHandle", ptr(p)), ("Address", ptr(p)), ("Source", "<u4")])


def image_fixed(p: int) -> np.dtype:
    """Image Load/Unload/DCStart fixed part (§3.3); FileName (UTF-16) follows."""
    return np.dtype([("ImageBase", ptr(p)), ("ImageSize", ptr(p)), ("ProcessId", "<u4"), ("ImageChecksum", "<u4"),
                     ("TimeDateStamp", "<u4"), ("SignatureLevel", "u1"), ("SignatureType", "u1"),
                     ("Reserved0", "<u2"), ("DefaultBase", ptr(p)), ("Reserved", "<u4", (4,))])


def process_fixed(p: int) -> np.dtype:
    """Process v4 fixed part (§3.1); UserSID, ImageFileName, CommandLine, PackageFullName, ApplicationId follow."""
    return np.dtype([("UniqueProcessKey", ptr(p)), ("ProcessId", "<u4"), ("ParentId", "<u4"), ("SessionId", "<u4"),
                     ("ExitStatus", "<i4"), ("DirectoryTableBase", ptr(p)), ("Flags", "<u4")])


def thread_fixed(p: int) -> np.dtype:
    """Thread v3 fixed part (§3.2); the (empty) UTF-16 ThreadName follows."""
    return np.dtype([("ProcessId", "<u4"), ("ThreadId", "<u4"), ("StackBase", ptr(p)), ("StackLimit", ptr(p)),
                     ("UserStackBase", ptr(p)), ("UserStackLimit", ptr(p)), ("StartAddr", ptr(p)),
                     ("Win32StartAddr", ptr(p)), ("TebBase", ptr(p)), ("SubProcessTag", "<u4"),
                     ("BasePriority", "i1"), ("PagePriority", "u1"), ("IoPriority", "u1"), ("ThreadFlags", "u1")])


def image_id_fixed(p: int) -> np.dtype:
    """ImageID Info (§3.9); OriginalFileName (UTF-16) follows."""
    return np.dtype([("ImageBase", ptr(p)), ("ImageSize", ptr(p)), ("ProcessId", "<u4"), ("TimeDateStamp", "<u4")])


def dbgid_rsds_fixed(p: int) -> np.dtype:
    """DbgID_RSDS (§3.9); the ANSI PdbFileName follows."""
    return np.dtype([("ImageBase", ptr(p)), ("ProcessId", "<u4"), ("GuidSig", "V16"), ("Age", "<u4")])


def sysconfig_cpu(p: int) -> np.dtype:
    """SysConfig CPU v3 (§3.10): 828 bytes on x64, 820 on x86."""
    return np.dtype([("ProcessorSpeed", "<u4"), ("NumberOfProcessors", "<u4"), ("MemorySize", "<u4"),
                     ("PageSize", "<u4"), ("AllocationGranularity", "<u4"), ("ComputerName", "V512"),
                     ("DomainName", "V268"), ("HyperThreadingFlag", ptr(p)), ("HighestUserAddress", ptr(p)),
                     ("ProcessorArchitecture", "<u2"), ("ProcessorLevel", "<u2"), ("ProcessorRevision", "<u2"),
                     ("NxEnabled", "u1"), ("PaeEnabled", "u1"), ("MemorySpeed", "<u4")])


def logfile_header(p: int) -> np.dtype:
    """TRACE_LOGFILE_HEADER (§1.3): 0x118 bytes (x64) / 0x110 (x86); LoggerName, LogFileName follow."""
    tz = [("Bias", "<i4"), ("StandardName", "V64"), ("StandardDate", "V16"), ("StandardBias", "<i4"),
          ("DaylightName", "V64"), ("DaylightDate", "V16"), ("DaylightBias", "<i4")]
    fields = [("BufferSize", "<u4"), ("VersionMajor", "u1"), ("VersionMinor", "u1"), ("SubVersion", "u1"),
              ("SubMinorVersion", "u1"), ("ProviderVersion", "<u4"), ("NumberOfProcessors", "<u4"),
              ("EndTime", "<i8"), ("TimerResolution", "<u4"), ("MaximumFileSize", "<u4"), ("LogFileMode", "<u4"),
              ("BuffersWritten", "<u4"), ("StartBuffers", "<u4"), ("PointerSize", "<u4"), ("EventsLost", "<u4"),
              ("CpuSpeedInMHz", "<u4"), ("LoggerName", ptr(p)), ("LogFileName", ptr(p))]
    fields += tz + [("Pad", "<u4"), ("BootTime", "<i8"), ("PerfFreq", "<i8"), ("StartTime", "<i8"),
                    ("ReservedFlags", "<u4"), ("BuffersLost", "<u4")]
    return np.dtype(fields)


#: QPC frequency of the simulated machine (ClockType 1), as in every sample file.
PERF_FREQ = 10_000_000
CLOCK_TYPE_QPC = 1
NS_PER_TICK = 1_000_000_000 // PERF_FREQ


def aligned(n):
    """Record advance: sizes round up to 8 bytes."""
    return (n + (RECORD_ALIGN - 1)) & ~(RECORD_ALIGN - 1)

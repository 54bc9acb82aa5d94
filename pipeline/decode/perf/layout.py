"""Byte layouts of Linux ``perf.data`` files (``perf record``'s file mode, header ``PERFILE2``), declared once.

Facts: the kernel's ``tools/perf/Documentation/perf.data-file-format.txt`` and ``include/uapi/linux/perf_event.h``.
A file is a header (``FILE_HEADER``), an array of attrs (``perf_event_attr`` of ``attr.size`` bytes followed by a
``perf_file_section`` of the attr's sample ids), a data section of records (each an 8-byte ``perf_event_header``:
u32 type, u16 misc, u16 size, size counting the header), and after the data section one ``perf_file_section``
per feature bit set in the header, in bit order. Only little-endian files are read: a big-endian file starts with
the magic's bytes reversed and is refused by name.
"""

from __future__ import annotations

import numpy as np

MAGIC = b"PERFILE2"
#: A file written on a big-endian machine: the u64 magic stored the other way round.
MAGIC_SWAPPED = b"2ELIFREP"
#: ``perf record -o -`` (pipe mode) writes a 16-byte header with the same magic and no sections.
PIPE_HEADER_SIZE = 16

SECTION = np.dtype([("offset", "<u8"), ("size", "<u8")])
FILE_HEADER = np.dtype([
    ("magic", "S8"), ("size", "<u8"), ("attr_size", "<u8"),
    ("attrs", SECTION), ("data", SECTION), ("event_types", SECTION),
    ("features", "<u8", (4,)),          # DECLARE_BITMAP(adds_features, 256)
])
FILE_HEADER_SIZE = 104

#: ``struct perf_event_attr`` up to PERF_ATTR_SIZE_VER0 (64 bytes), then the fields the decoder reads from later
#: versions (present when ``size`` says so). Byte offsets.
ATTR_TYPE, ATTR_SIZE, ATTR_CONFIG, ATTR_PERIOD, ATTR_SAMPLE_TYPE, ATTR_READ_FORMAT, ATTR_FLAGS = 0, 4, 8, 16, 24, 32, 40
ATTR_SAMPLE_REGS_USER = 80      # u64, from PERF_ATTR_SIZE_VER3 (96)
ATTR_SAMPLE_STACK_USER = 88     # u32, from VER3
ATTR_CLOCKID = 92               # s32, from VER3 (meaningful with the use_clockid flag)
ATTR_SIZE_VER0 = 64
ATTR_SIZE_VER3 = 96

# perf_event_attr flag bits (the u64 bitfield at ATTR_FLAGS).
FLAG_FREQ = 1 << 10
FLAG_SAMPLE_ID_ALL = 1 << 18
FLAG_MMAP2 = 1 << 23
FLAG_USE_CLOCKID = 1 << 25

# perf_event_attr.sample_type bits: the fields a PERF_RECORD_SAMPLE holds, in this order.
SAMPLE_IP = 1 << 0
SAMPLE_TID = 1 << 1
SAMPLE_TIME = 1 << 2
SAMPLE_ADDR = 1 << 3
SAMPLE_READ = 1 << 4
SAMPLE_CALLCHAIN = 1 << 5
SAMPLE_ID = 1 << 6
SAMPLE_CPU = 1 << 7
SAMPLE_PERIOD = 1 << 8
SAMPLE_STREAM_ID = 1 << 9
SAMPLE_RAW = 1 << 10
SAMPLE_BRANCH_STACK = 1 << 11
SAMPLE_REGS_USER = 1 << 12
SAMPLE_STACK_USER = 1 << 13
SAMPLE_WEIGHT = 1 << 14
SAMPLE_DATA_SRC = 1 << 15
SAMPLE_IDENTIFIER = 1 << 16
SAMPLE_TRANSACTION = 1 << 17
SAMPLE_REGS_INTR = 1 << 18
SAMPLE_NAMES = {SAMPLE_IP: "IP", SAMPLE_TID: "TID", SAMPLE_TIME: "TIME", SAMPLE_ADDR: "ADDR", SAMPLE_READ: "READ",
                SAMPLE_CALLCHAIN: "CALLCHAIN", SAMPLE_ID: "ID", SAMPLE_CPU: "CPU", SAMPLE_PERIOD: "PERIOD",
                SAMPLE_STREAM_ID: "STREAM_ID", SAMPLE_RAW: "RAW", SAMPLE_BRANCH_STACK: "BRANCH_STACK",
                SAMPLE_REGS_USER: "REGS_USER", SAMPLE_STACK_USER: "STACK_USER", SAMPLE_WEIGHT: "WEIGHT",
                SAMPLE_DATA_SRC: "DATA_SRC", SAMPLE_IDENTIFIER: "IDENTIFIER", SAMPLE_TRANSACTION: "TRANSACTION",
                SAMPLE_REGS_INTR: "REGS_INTR"}
#: branch_sample_type bit that adds ``hw_idx`` to a BRANCH_STACK field.
BRANCH_HW_INDEX = 1 << 17

# perf_event_attr.read_format bits (the READ field's layout).
READ_TOTAL_TIME_ENABLED = 1 << 0
READ_TOTAL_TIME_RUNNING = 1 << 1
READ_ID = 1 << 2
READ_GROUP = 1 << 3
READ_LOST = 1 << 4

# Record types (perf_event_header.type): the kernel's below 64, the perf tool's from 64.
RECORD_MMAP = 1
RECORD_LOST = 2
RECORD_COMM = 3
RECORD_EXIT = 4
RECORD_THROTTLE = 5
RECORD_UNTHROTTLE = 6
RECORD_FORK = 7
RECORD_READ = 8
RECORD_SAMPLE = 9
RECORD_MMAP2 = 10
RECORD_LOST_SAMPLES = 13
RECORD_HEADER_BUILD_ID = 67
RECORD_FINISHED_ROUND = 68
RECORD_COMPRESSED = 81
#: The highest record type known to this version of perf (PERF_RECORD_FINISHED_INIT = 82, perf 6.1); a header with
#: a larger type cannot be a record, which is how a walk that lost its way notices (``kernels.RESYNC``).
RECORD_TYPE_MAX = 82
RECORD_NAMES = {
    1: "MMAP", 2: "LOST", 3: "COMM", 4: "EXIT", 5: "THROTTLE", 6: "UNTHROTTLE", 7: "FORK", 8: "READ", 9: "SAMPLE",
    10: "MMAP2", 11: "AUX", 12: "ITRACE_START", 13: "LOST_SAMPLES", 14: "SWITCH", 15: "SWITCH_CPU_WIDE",
    16: "NAMESPACES", 17: "KSYMBOL", 18: "BPF_EVENT", 19: "CGROUP", 20: "TEXT_POKE", 21: "AUX_OUTPUT_HW_ID",
    64: "HEADER_ATTR", 65: "HEADER_EVENT_TYPE", 66: "HEADER_TRACING_DATA", 67: "HEADER_BUILD_ID",
    68: "FINISHED_ROUND", 69: "ID_INDEX", 70: "AUXTRACE_INFO", 71: "AUXTRACE", 72: "AUXTRACE_ERROR",
    73: "THREAD_MAP", 74: "CPU_MAP", 75: "STAT_CONFIG", 76: "STAT", 77: "STAT_ROUND", 78: "EVENT_UPDATE",
    79: "TIME_CONV", 80: "HEADER_FEATURE", 81: "COMPRESSED", 82: "FINISHED_INIT",
}
RECORD_HEADER_SIZE = 8

# perf_event_header.misc
MISC_CPUMODE_MASK = 0x7
MISC_KERNEL = 1
MISC_USER = 2
MISC_COMM_EXEC = 1 << 13        # COMM: the name changed because the process exec'd
MISC_MMAP_DATA = 1 << 13        # MMAP/MMAP2: a mapping without PROT_EXEC (``perf record -d``, and --call-graph dwarf)
MISC_MMAP_BUILD_ID = 1 << 14    # MMAP2: the maj/min/ino fields hold a build id instead
MISC_BUILD_ID_SIZE = 1 << 15    # HEADER_BUILD_ID entry: the build id's size is in its byte 20

# Record bodies (byte offsets after the 8-byte header).
# MMAP:  u32 pid, tid; u64 addr, len, pgoff; char filename[]
# MMAP2: u32 pid, tid; u64 addr, len, pgoff; u32 maj, min; u64 ino, ino_generation (or u8 build_id_size, 3 bytes,
#        u8 build_id[20]); u32 prot, flags; char filename[]
MMAP_FILENAME = 8 + 32
MMAP2_MAJ, MMAP2_MIN, MMAP2_INO = 8 + 32, 8 + 36, 8 + 40
MMAP2_BUILD_ID_SIZE, MMAP2_BUILD_ID = 8 + 32, 8 + 36
MMAP2_PROT, MMAP2_FLAGS, MMAP2_FILENAME = 8 + 56, 8 + 60, 8 + 64
# COMM: u32 pid, tid; char comm[]
COMM_NAME = 8 + 8
# FORK and EXIT: u32 pid, ppid, tid, ptid; u64 time
TASK_SIZE = 8 + 24
#: Callchain entries at or above this are context markers (PERF_CONTEXT_KERNEL = -128, PERF_CONTEXT_USER = -512,
#: PERF_CONTEXT_MAX = -4095 ...), not addresses.
CONTEXT_MAX = np.uint64((1 << 64) - 4095)     # (numpy scalars: a plain int past int64 meets int64 badly, NEP 50)
CONTEXT_KERNEL = np.uint64((1 << 64) - 128)
CONTEXT_USER = np.uint64((1 << 64) - 512)

# Feature bits (header.features) and their sections.
FEAT_BUILD_ID = 2
FEAT_HOSTNAME = 3
FEAT_OSRELEASE = 4
FEAT_VERSION = 5
FEAT_ARCH = 6
FEAT_NRCPUS = 7
FEAT_CMDLINE = 11
FEAT_SAMPLE_TIME = 21
FEAT_CLOCKID = 23
FEAT_CLOCK_DATA = 29
FEATURE_NAMES = {
    1: "TRACING_DATA", 2: "BUILD_ID", 3: "HOSTNAME", 4: "OSRELEASE", 5: "VERSION", 6: "ARCH", 7: "NRCPUS",
    8: "CPUDESC", 9: "CPUID", 10: "TOTAL_MEM", 11: "CMDLINE", 12: "EVENT_DESC", 13: "CPU_TOPOLOGY",
    14: "NUMA_TOPOLOGY", 15: "BRANCH_STACK", 16: "PMU_MAPPINGS", 17: "GROUP_DESC", 18: "AUXTRACE", 19: "STAT",
    20: "CACHE", 21: "SAMPLE_TIME", 22: "MEM_TOPOLOGY", 23: "CLOCKID", 24: "DIR_FORMAT", 25: "BPF_PROG_INFO",
    26: "BPF_BTF", 27: "COMPRESSED", 28: "CPU_PMU_CAPS", 29: "CLOCK_DATA", 30: "HYBRID_TOPOLOGY", 31: "PMU_CAPS",
}
#: HEADER_CLOCK_DATA (``perf record -k CLOCK``): u32 version, u32 clockid, u64 wall-clock ns (gettimeofday), u64
#: ns of the sample clock, read at one moment: what turns a sample's time into Unix time.
CLOCK_DATA_SIZE = 4 + 4 + 8 + 8
#: HEADER_BUILD_ID entry: perf_event_header, s32 pid, u8 build_id[24] (20 used, byte 20 the size with
#: MISC_BUILD_ID_SIZE), char filename[] up to the entry's size.
BUILD_ID_PID, BUILD_ID_BYTES, BUILD_ID_SIZE_BYTE, BUILD_ID_FILENAME = 8, 12, 32, 36
BUILD_ID_DEFAULT_SIZE = 20

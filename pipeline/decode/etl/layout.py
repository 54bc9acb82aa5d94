"""Binary layouts of ETL files, declared once (sizes checked against docs/etl-format.md by a test).

Offsets are relative to the start of the structure they name. ``P`` in comments is the pointer size
of the record (4 or 8), which comes from each record's header type, never from the file header.
"""

from __future__ import annotations

import uuid

import numpy as np

# --- WMI_BUFFER_HEADER (§1.2): 0x48 bytes, same for 32- and 64-bit writers --------------------------
BUFFER_HEADER = np.dtype(
    [
        ("buffer_size", "<u4"),      # 0x00 on-disk size of this buffer = stride to the next one
        ("saved_offset", "<u4"),     # 0x04 fill mark incl. header (uncompressed fill for compressed buffers)
        ("current_offset", "<u4"),   # 0x08 kernel bookkeeping, ignored
        ("reference_count", "<i4"),  # 0x0C
        ("timestamp", "<i8"),        # 0x10 flush time
        ("sequence", "<i8"),         # 0x18 sequence number (per-CPU order)
        ("clock_or_next", "<u8"),    # 0x20 stale kernel pointer in files
        ("processor_index", "<u2"),  # 0x28 ETW_BUFFER_CONTEXT.ProcessorIndex (mask 0x07FF)
        ("logger_id", "<u2"),        # 0x2A
        ("state", "<u4"),            # 0x2C
        ("offset", "<u4"),           # 0x30 fill mark when flushed (dissect: FilledBytes)
        ("buffer_flag", "<u2"),      # 0x34 BUFFER_FLAG_*
        ("buffer_type", "<u2"),      # 0x36 4 = HEADER
        ("reserved", "V16"),         # 0x38 stale pointers
    ]
)
BUFFER_HEADER_SIZE = 0x48
PROCESSOR_INDEX_MASK = 0x07FF

BUFFER_FLAG_EVENTS_LOST = 0x0002
BUFFER_FLAG_BUFFER_LOST = 0x0004
BUFFER_FLAG_PROC_INDEX = 0x0020
BUFFER_FLAG_COMPRESSED = 0x0040
BUFFER_TYPE_HEADER = 4

# --- TRACE_LOGFILE_HEADER (§1.3), payload of the first record; (x64 offset, x86 offset) --------------
LOGFILE_PAYLOAD_FILE_OFFSET = 0x68        # header buffer 0x48 + SYSTEM_TRACE_HEADER 0x20
LOGFILE_HEADER_EVENT_TS_FILE_OFFSET = 0x58  # SystemTime of the header event = sync point of StartTime
LOGFILE = {
    "buffer_size": (0x00, 0x00, "<u4"),
    "version_major": (0x04, 0x04, "<u1"),
    "version_minor": (0x05, 0x05, "<u1"),
    "format_major": (0x06, 0x06, "<u1"),
    "format_minor": (0x07, 0x07, "<u1"),
    "os_build": (0x08, 0x08, "<u4"),
    "cpu_count": (0x0C, 0x0C, "<u4"),
    "end_time_filetime": (0x10, 0x10, "<i8"),
    "timer_resolution": (0x18, 0x18, "<u4"),
    "maximum_file_size": (0x1C, 0x1C, "<u4"),
    "log_file_mode": (0x20, 0x20, "<u4"),
    "buffers_written": (0x24, 0x24, "<u4"),
    "pointer_size": (0x2C, 0x2C, "<u4"),
    "events_lost": (0x30, 0x30, "<u4"),
    "cpu_speed_mhz": (0x34, 0x34, "<u4"),
    "timezone_bias_min": (0x48, 0x40, "<i4"),
    "boot_time_filetime": (0xF8, 0xF0, "<i8"),
    "perf_freq": (0x100, 0xF8, "<i8"),
    "start_time_filetime": (0x108, 0x100, "<i8"),
    "clock_type": (0x110, 0x108, "<u4"),
    "buffers_lost": (0x114, 0x10C, "<u4"),
}
#: The FILETIME fields of the logfile header, and the last FILETIME a date can hold (9999-12-31, 100 ns units).
LOGFILE_TIMES = ("start_time_filetime", "end_time_filetime", "boot_time_filetime")
MAX_FILETIME = 2_650_467_743_999_999_999
#: Where a process's user address space ends, by pointer size: 2^56 on 64-bit Windows (2^47, or 2^56 with
#: 5-level paging), 4 GiB for a 32-bit process. No allocation (VirtualAlloc region, heap block) is larger; a
#: value beyond it is corruption, and would overflow the sums of sizes downstream.
USER_SPACE_END = {8: 1 << 56, 4: 1 << 32}
LOGFILE_HEADER_SIZE = {8: 0x118, 4: 0x110}  # fixed part; LoggerName and LogFileName (UTF-16) follow
LOG_FILE_MODE_COMPRESSED = 0x04000000

CLOCK_QPC, CLOCK_SYSTEM_TIME, CLOCK_CPU_CYCLES = 1, 2, 3

# --- Record headers (§2.1): header type = byte 2 of the first u32, MarkerFlags = byte 3 ---------------
MARKER_FLAGS = 0xC0
MESSAGE_MARKER_FLAGS = 0x90
END_OF_DATA = 0xFFFFFFFF

HT_SYSTEM32, HT_SYSTEM64 = 0x01, 0x02
HT_COMPACT32, HT_COMPACT64 = 0x03, 0x04
HT_FULL32, HT_INSTANCE32 = 0x0A, 0x0B
HT_PERFINFO32, HT_PERFINFO64 = 0x10, 0x11
HT_EVENT32, HT_EVENT64 = 0x12, 0x13
HT_FULL64, HT_INSTANCE64 = 0x14, 0x15
HT_MESSAGE = 0x90  # pseudo header type for WPP MESSAGE_TRACE_HEADER records (MarkerFlags 0x90)

#: header type -> (header size, pointer size). Record size is u16 @+4 for SYSTEM/COMPACT/PERFINFO and
#: u16 @+0 for the others (the "size at 0" kinds).
HEADER_KINDS = {
    HT_SYSTEM32: (0x20, 4), HT_SYSTEM64: (0x20, 8),
    HT_COMPACT32: (0x18, 4), HT_COMPACT64: (0x18, 8),
    HT_PERFINFO32: (0x10, 4), HT_PERFINFO64: (0x10, 8),
    HT_FULL32: (0x30, 4), HT_FULL64: (0x30, 8),
    HT_INSTANCE32: (0x48, 4), HT_INSTANCE64: (0x48, 8),
    HT_EVENT32: (0x50, 4), HT_EVENT64: (0x50, 8),
}
SYSTEM_KINDS = (HT_SYSTEM32, HT_SYSTEM64, HT_COMPACT32, HT_COMPACT64, HT_PERFINFO32, HT_PERFINFO64)
GUID_KINDS = (HT_FULL32, HT_FULL64, HT_INSTANCE32, HT_INSTANCE64, HT_EVENT32, HT_EVENT64)

# Field offsets inside the record headers (§2.2-§2.5).
SYS_VERSION, SYS_SIZE, SYS_HOOK, SYS_TID, SYS_PID, SYS_TS = 0x00, 0x04, 0x06, 0x08, 0x0C, 0x10
PERFINFO_TS = 0x08
PERFINFO_PEBS_FLAG = 0x8000
PERFINFO_PMC_SHIFT, PERFINFO_PMC_MASK = 8, 0x7
FULL_SIZE, FULL_TYPE, FULL_LEVEL, FULL_VERSION = 0x00, 0x04, 0x05, 0x06
FULL_TID, FULL_PID, FULL_TS, FULL_GUID = 0x08, 0x0C, 0x10, 0x18
EH_SIZE, EH_FLAGS, EH_TID, EH_PID, EH_TS, EH_GUID = 0x00, 0x04, 0x08, 0x0C, 0x10, 0x18
EH_ID, EH_VERSION, EH_CHANNEL, EH_LEVEL, EH_OPCODE, EH_TASK, EH_KEYWORD = 0x28, 0x2A, 0x2B, 0x2C, 0x2D, 0x2E, 0x30
EH_FLAG_EXTENDED_INFO = 0x0001
EXT_ITEM_HEADER_SIZE = 8  # {u16 ItemSize; u16 ExtType; u16 Linkage; u16 DataSize}
EXT_STACK_TRACE32, EXT_STACK_TRACE64 = 5, 6
EXT_STACK_KEY32, EXT_STACK_KEY64 = 17, 18
MSG_SIZE, MSG_NUMBER, MSG_FLAGS = 0x00, 0x04, 0x06
MSG_HEADER_SIZE = 8
MSG_OPT_SEQUENCE, MSG_OPT_GUID, MSG_OPT_COMPONENT, MSG_OPT_TIMESTAMP, MSG_OPT_SYSTEMINFO = 0x1, 0x2, 0x4, 0x8, 0x20

# --- Kernel groups -> classic provider GUIDs (§2.2); HookId = group << 8 | opcode ----------------------
KERNEL_GROUP_GUIDS = {
    0x00: "68fdd900-4a3e-11d1-84f4-0000f80464e3",  # EventTrace (header)
    0x01: "3d6fa8d4-fe05-11d0-9dda-00c04fd7ba7c",  # DiskIo
    0x02: "3d6fa8d3-fe05-11d0-9dda-00c04fd7ba7c",  # PageFault / memory
    0x03: "3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c",  # Process
    0x04: "90cbdc39-4a3e-11d1-84f4-0000f80464e3",  # FileIo
    0x05: "3d6fa8d1-fe05-11d0-9dda-00c04fd7ba7c",  # Thread
    0x06: "9a280ac0-c8e0-11d1-84e2-00c04fb998a2",  # TcpIp
    0x07: "3282fc76-feed-498e-8aa7-e70f459d430e",  # Job
    0x08: "bf3a50c5-a9c9-4988-a005-2df0b7c80f80",  # UdpIp
    0x09: "ae53722e-c863-11d2-8659-00c04fa321a1",  # Registry
    0x0A: "13976d09-a327-438c-950b-7f03192815c7",  # DbgPrint
    0x0B: "01853a65-418f-4f36-aefc-dc0f1d2fd235",  # SysConfig
    0x0C: "99134383-5248-43fc-834b-529454e75df3",  # Spare1
    0x0D: "42695762-ea50-497a-9068-5cbbb35e0b95",  # Wnf
    0x0E: "0268a8b6-74fd-4302-9dd0-6e8f1795c0cf",  # Pool
    0x0F: "ce1dbfb4-137e-4da6-87b0-3f59aa102cbc",  # PerfInfo
    0x10: "222962ab-6180-4b88-a825-346b75f2a24a",  # Heap
    0x11: "89497f50-effe-4440-8cf2-ce6b1cdcaca7",  # Object
    0x12: "e43445e0-0903-48c3-b878-ff0fccebdd04",  # Power
    0x13: "a9152f00-3f58-4bee-92a1-70c7d079d5dd",  # ModBound
    0x14: "2cb15d1d-5fc1-11d2-abe1-00a0c911f518",  # Image
    0x15: "b2d14872-7c5b-463d-8419-ee9bf7d23e04",  # Dpc
    0x16: "7687a439-f752-45b8-b741-321aec0f8df9",  # Cc
    0x17: "3ac66736-cc59-4cff-8115-8df50e39816b",  # CritSec
    0x18: "def2fe46-7bd6-4b80-bd94-f57fe20d0ce3",  # StackWalk
    0x19: "9aec974b-5b8e-4118-9b92-3186d8002ce5",  # Ums
    0x1A: "45d8cccd-539f-4b72-a8b7-5c683142609a",  # Alpc
    0x1B: "d837ca92-12b9-44a5-ad6a-3a65b3578aa8",  # SplitIo
    0x1C: "c861d0e2-a2c1-4d36-9f9c-970bab943a12",  # ThreadPool
    0x1D: "7f2a405c-69b5-4bf9-a1f5-30e8f1afab5e",  # Hypervisor
    0x1E: "2ce9a149-effe-42f0-a635-a1d39e26c8f2",  # HypervisorX
}
NULL_GUID = "00000000-0000-0000-0000-000000000000"  # kernel groups >= 0x1F (unnamed)
#: Process group type 10 is the Image Load event (reported under the Image provider).
IMAGE_LOAD_HOOK = 0x030A

PROCESS_GUID = KERNEL_GROUP_GUIDS[0x03]
THREAD_GUID = KERNEL_GROUP_GUIDS[0x05]
IMAGE_GUID = KERNEL_GROUP_GUIDS[0x14]
PERFINFO_GUID = KERNEL_GROUP_GUIDS[0x0F]
STACKWALK_GUID = KERNEL_GROUP_GUIDS[0x18]
PAGEFAULT_GUID = KERNEL_GROUP_GUIDS[0x02]
HEAP_GUID = KERNEL_GROUP_GUIDS[0x10]
SYSCONFIG_GUID = KERNEL_GROUP_GUIDS[0x0B]
IMAGE_ID_GUID = "b3e675d7-2554-4f18-830b-2762732560de"  # KernelTraceControl ImageID / DbgID (§3.9)


def group_guid_table() -> np.ndarray:
    """(256, 16) uint8: provider GUID bytes (Windows memory order) of each kernel group."""
    table = np.zeros((256, 16), dtype=np.uint8)
    for group, text in KERNEL_GROUP_GUIDS.items():
        table[group] = np.frombuffer(uuid.UUID(text).bytes_le, dtype=np.uint8)
    return table


# --- Payload layouts (§3), x64 offsets; x86 layouts derive from the pointer count before each field ---
# Written as (offset when P=4, number of pointers before the field): offset = off32 + (P-4) * nptr.
def host_offset(off32: int, nptr: int, P: int) -> int:
    return off32 + (P - 4) * nptr


PROCESS = {  # §3.1 WMI_PROCESS_INFORMATION
    "unique_key": (0x00, 0), "pid": (0x04, 1), "parent_pid": (0x08, 1), "session": (0x0C, 1),
    "exit_status": (0x10, 1), "directory_table_base": (0x14, 1), "flags": (0x18, 2), "sid": (0x1C, 2),
}
THREAD = {  # §3.2
    "pid": (0x00, 0), "tid": (0x04, 0), "stack_base": (0x08, 0), "stack_limit": (0x0C, 1),
    "user_stack_base": (0x10, 2), "user_stack_limit": (0x14, 3), "start_addr": (0x18, 4),
    "win32_start_addr": (0x1C, 5), "teb_base": (0x20, 6), "sub_process_tag": (0x24, 7),
    "base_priority": (0x28, 7), "name": (0x2C, 7),
}
IMAGE = {  # §3.3
    "base": (0x00, 0), "size": (0x04, 1), "pid": (0x08, 2), "checksum": (0x0C, 2),
    "time_date_stamp": (0x10, 2), "default_base": (0x18, 2), "file_name": (0x2C, 3),
}
SAMPLED_PROFILE = {"ip": (0x00, 0), "tid": (0x04, 1), "count": (0x08, 1)}  # §3.4, payload 12/16
STACK_WALK = {"event_ts": 0x00, "pid": 0x08, "tid": 0x0C, "frames": 0x10}  # §3.5, same for 4 and 8
#: Lowest kernel-mode address of a 64-bit / 32-bit system: a stack record whose leaf frame is below it
#: is a user-mode half. numpy scalars of the type they are compared in: the 64-bit one does not fit an
#: int64, and numpy's promotion of plain ints (NEP 50) raises OverflowError on it in some of its functions.
KERNEL_SPACE_64, KERNEL_SPACE_32 = np.uint64(0xFFFF_8000_0000_0000), np.uint64(0x8000_0000)
VIRTUAL_ALLOC = {"base": (0x00, 0), "size": (0x04, 1), "pid": (0x08, 2), "flags": (0x0C, 2)}  # §3.7, 16/24
IMAGE_ID = {"base": (0x00, 0), "size": (0x04, 1), "pid": (0x08, 2), "time_date_stamp": (0x0C, 2),
            "file_name": (0x10, 2)}  # §3.9 ImageID (Type 0)
DBG_ID = {"base": (0x00, 0), "pid": (0x04, 1), "guid": (0x08, 1), "age": (0x18, 1),
          "pdb_name": (0x1C, 1)}  # §3.9 DbgID_RSDS (Type 36) / ILRSDS (37)
SYSCONFIG_CPU = {"mhz": 0, "cpus": 4, "memory_mb": 8, "page_size": 12, "alloc_granularity": 16,
                 "computer_name": 20, "computer_name_bytes": 512}  # §3.10

# Heap group 0x10 (§3.8), packed; (off32, nptr) pairs as above. SIZE_T counts as a pointer.
HEAP_CREATE = {"heap": (0x00, 0), "flags": (0x04, 1)}
HEAP_ALLOC = {"heap": (0x00, 0), "size": (0x04, 1), "address": (0x08, 2), "source": (0x0C, 3)}
HEAP_REALLOC = {"heap": (0x00, 0), "address": (0x04, 1), "old_address": (0x08, 2), "size": (0x0C, 3),
                "old_size": (0x10, 4), "source": (0x14, 5)}
HEAP_FREE = {"heap": (0x00, 0), "address": (0x04, 1), "source": (0x08, 2)}
HEAP_DESTROY = {"heap": (0x00, 0)}

"""Symbolize stage: every unique stack frame of a run -> module, function, inline chain, file:line.

Entry point: :func:`run` (:mod:`.stage`). Reads ``RUN_DIR/decoded/{stacks,images,image_ids}`` and every table whose rows
reference a stack (``STACK_SOURCES``: samples, VirtualAlloc, heap events, heap snapshot blocks, inline
event stacks) and writes ``RUN_DIR/symbolized/frames.parquet`` (see ``schema.md``). The steps:

1. **Frames.** Unique (pid, stack) pairs of those rows (*events*) are expanded into their frames, plus
   each sample's ``ip``; one row per unique (pid, address, role) with its first time. The role is
   *leaf* (frame 0 of a stack, or an ip: the instruction that ran) or *return address* (every other
   frame: the instruction after a call).
2. **Images.** Each frame is mapped to the image loaded at that address in that process at that
   time (:mod:`.images`). Only frames that two images of one process could both cover (a reused
   address range) are mapped again with the time of every event that holds them.
3. **Symbols.** The distinct debug ids of the images that occur go to the dask pool, one task
   each (:func:`.build.resolve_debug_id`): find the PDB or Breakpad file along the symbol path
   (downloading it into the cache once), build its sorted address table once per debug id.
4. **Lookups.** Per debug id, one ``searchsorted`` over the frames' RVAs (a leaf at its rva, a return
   address at rva - 1, inside its call) and gathers up the inline chains give one output row per frame
   and inline level. So one (image, offset, role) resolves to the same names in every process and view.

A missing or unusable symbol file is reported once per image, with its reason, in the manifest
(``images_without_symbols``); its frames stay visible as ``module+0xoffset``.
"""

from pipeline.symbolize.frames import STACK_SOURCES, collect_frames, map_images
from pipeline.symbolize.identity import image_debug_ids, module_name
from pipeline.symbolize.stage import STAGE, SYMBOLIC_MISSING, headline, run, symbolic_missing

__all__ = ["STACK_SOURCES", "STAGE", "SYMBOLIC_MISSING", "collect_frames", "headline", "image_debug_ids", "map_images",
           "module_name", "run", "symbolic_missing"]

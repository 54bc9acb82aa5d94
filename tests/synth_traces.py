"""The synthesized traces the tests share: one per variant, made once per test run by the fixtures ``synth_traces``
(and ``synth_trace``, one variant a test) and decoded once by ``synth_decoded``, in ``tests/conftest.py``.

Variants cover each option both ways: compression, pointer size 4/8, full stacks / stack caching
(caching with both pointer sizes), and a trace whose samples mostly have stacks of their own (stack
variety 200: ~4,000 distinct stacks among ~7,000 samples). Other stages' tests use these names: keep
them stable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config import SynthConfig

VARIANTS = {
    "plain64": SynthConfig(seed=3, size="3MB", cpus=4),
    "xpress32_cached": SynthConfig(seed=4, size="3MB", cpus=3, compress=True, pointer_size=4, stack_caching=True),
    "xpress64": SynthConfig(seed=5, size="3MB", cpus=5, compress=True),
    "plain32_cached": SynthConfig(seed=6, size="2MB", cpus=2, pointer_size=4, stack_caching=True),
    "plain64_cached": SynthConfig(seed=7, size="2MB", cpus=3, stack_caching=True),
    "plain64_varied": SynthConfig(seed=8, size="4MB", cpus=4, stack_variety=200),
}


@dataclass
class Synth:
    name: str
    cfg: SynthConfig
    path: Path
    truth: dict
    summary: dict

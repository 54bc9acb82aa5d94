"""Display names: Rust legacy (hash stripped, kept apart) and v0, MSVC C++, C names left alone."""

from __future__ import annotations

import pytest

from pipeline.symbolize.names import clean_name, clean_names, is_mangled, rust_hash, strip_arguments

CASES = [
    # Rust legacy, with and without the underscore symbolic strips from PE publics
    ("_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write"),
    ("ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write"),
    ("_ZN70_$LT$alloc..vec..Vec$LT$T$C$A$GT$$u20$as$u20$core..ops..drop..Drop$GT$4drop17h5f2a7c8e9b1d3f40E",
     "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop"),
    # private PDB names carry a CodeView argument list after the (mangled) name
    ("_ZN7mycrate4hash3mix17h1122334455667788E(unsigned long long, unsigned long long)", "mycrate::hash::mix"),
    # Rust v0
    ("_RNvCs1234_7mycrate4main", "mycrate::main"),
    ("RNvCs1234_7mycrate4main", "mycrate::main"),
    ("_RINvNtCs9I6RxzOjugb_7mycrate6worker12generic_stepmEB4_", "mycrate::worker::generic_step::<u32>"),
    # MSVC C++
    ("?optimize@back@rustc_codegen_llvm@@YA_KPEAUModuleBuffer@12@H@Z", "rustc_codegen_llvm::back::optimize"),
    ("rustc_codegen_llvm::back::optimize(rustc_codegen_llvm::back::ModuleBuffer*, int)",
     "rustc_codegen_llvm::back::optimize"),
    # C names that look a little like Rust must stay as they are
    ("_RTC_Initialize", "_RTC_Initialize"),
    ("_RTC_Initialize(unsigned long long)", "_RTC_Initialize"),
    ("RtlUserThreadStart", "RtlUserThreadStart"),
    ("Run", "Run"),
    ("R", "R"),
    ("mainCRTStartup", "mainCRTStartup"),
    # .NET native image publics
    ("System.Xml.DtdParser.LoadParsingBuffer()", "System.Xml.DtdParser.LoadParsingBuffer"),
    ("[COLD] System.Xml.Schema.XmlNumeric2Converter.ChangeType(Single, System.Type)",
     "[COLD] System.Xml.Schema.XmlNumeric2Converter.ChangeType"),
    # rustc's own CodeView names are already readable
    ("mycrate_v0::worker::generic_step<u32>(unsigned int)", "mycrate_v0::worker::generic_step<u32>"),
]


@pytest.mark.parametrize("raw,expected", CASES)
def test_clean_name(raw, expected):
    assert clean_name(raw) == expected


def test_batch_gives_the_expected_names():
    """The batch call against the expected names themselves (it was once compared with ``clean_name``, which calls
    it: a function compared with itself)."""
    raws = [r for r, _ in CASES] + ["", "_ZN4core3fmt5write17h0123456789abcdefE"]
    assert clean_names(raws) == [e for _, e in CASES] + ["", "core::fmt::write"]


def test_rust_hash_is_kept_apart():
    assert rust_hash("_ZN4core3fmt5write17h0123456789abcdefE") == "0123456789abcdef"
    assert rust_hash("ZN4core3fmt5write17h0123456789abcdefE(unsigned char const*)") == "0123456789abcdef"
    assert rust_hash("_RNvCs1234_7mycrate4main") is None
    assert rust_hash("_RTC_Initialize") is None


def test_c_names_are_not_mangled():
    assert not is_mangled("_RTC_Initialize")
    assert not is_mangled("RtlCaptureContext")
    assert is_mangled("_RNvCs1234_7mycrate4main")


def test_strip_arguments_keeps_operators_and_plain_names():
    assert strip_arguments("operator()(int) const") == "operator()"
    assert strip_arguments("a::b<(lambda)>") == "a::b<(lambda)>"
    assert strip_arguments("f(g(int))") == "f"
    assert strip_arguments("()") == "()"

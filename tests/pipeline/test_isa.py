"""The CPU's ISA as edgekit records it, and what parity reports say about it on any x86-64 host.

The int8 and bf16 arithmetic of a CPU depends on its ISA (VNNI/AMX vs AVX2's saturating
vpmaddubsw; bf16 only with AVX512-BF16/AMX). These tests pin the parsing and the notes on
cpuinfo texts of both CPU kinds this project's machines have, whatever CPU runs them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.backends.onnxruntime.run import x64_quant_precision
from edge.capabilities import ISA_CLASSES, cpu_isa, measured_on, parse_cpuinfo
from edge.errors import EdgeError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.verify.parity import host_notes

# Trimmed /proc/cpuinfo of the two CPU kinds CI lands on (flags as the kernel prints them).
ZEN2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand avx2 bmi2 sha_ni clzero
"""
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512_vnni avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
"""


def test_cpuinfo_of_both_x86_kinds_and_arm() -> None:
    zen2, spr, arm = parse_cpuinfo(ZEN2), parse_cpuinfo(SAPPHIRE_RAPIDS), parse_cpuinfo(GRAVITON)
    assert zen2.model == "AMD EPYC 7B12" and zen2.flags == {"avx2"}
    assert not zen2.int8_dot_product and not zen2.native_bf16
    assert spr.flags == {
        "avx2",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
        "amx_bf16",
        "amx_tile",
        "amx_int8",
    }
    assert spr.int8_dot_product and spr.native_bf16
    assert arm.flags == {"asimddp", "asimdhp"} and arm.int8_dot_product and not arm.native_bf16
    assert arm.native_fp16 and not zen2.native_fp16 and not spr.native_fp16  # F16C or AMX-BF16 are not fp16 math
    assert not parse_cpuinfo("").known and "unknown" in parse_cpuinfo("").describe()


def test_isa_class_names_the_fastest_kernels_whatever_cpu_runs_the_test() -> None:
    def flags(f: str) -> str:
        return parse_cpuinfo(f"model name\t: X\nflags\t\t: sse2 {f}\n").isa_class

    assert parse_cpuinfo(ZEN2).isa_class == "AVX2-only"  # AMD EPYC Rome/Milan
    assert parse_cpuinfo(SAPPHIRE_RAPIDS).isa_class == "AMX"
    assert parse_cpuinfo(GRAVITON).isa_class == "ARM dot product"
    assert flags("avx2 avx512f avx512_vnni avx512_bf16") == "AVX-512 VNNI"  # AMD EPYC Genoa, Ice Lake
    assert flags("avx2 avx512f") == "AVX-512"  # Skylake-SP
    assert flags("avx2 avx_vnni") == "AVX2 + AVX-VNNI"  # Alder Lake
    assert flags("avx") == "baseline (no AVX2, no ARM dot product)"
    assert parse_cpuinfo("Features\t: fp asimd asimddp i8mm\n").isa_class == "ARM i8mm"
    assert parse_cpuinfo("").isa_class == "unknown"
    assert cpu_isa().isa_class in ISA_CLASSES and cpu_isa().to_json()["isa_class"] == cpu_isa().isa_class
    line = measured_on(parse_cpuinfo(ZEN2))
    assert "AMD EPYC 7B12 [AVX2-only]" in line and "load average" in line and "UTC" in line


def test_every_benchmark_prints_where_it_measured() -> None:
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    not_timed = {"_common.py", "wings.py"}  # wings.py reads the import graph from git: it times nothing
    scripts = [p for p in sorted(bench.glob("*.py")) if p.name not in not_timed]
    assert scripts
    silent = [p.name for p in scripts if "measured_on" not in p.read_text(encoding="utf-8")]
    assert silent == [], "benchmarks that print no CPU class and load (edge.capabilities.measured_on)"


def test_parity_notes_name_the_isa_the_result_depends_on() -> None:
    zen2, spr = parse_cpuinfo(ZEN2), parse_cpuinfo(SAPPHIRE_RAPIDS)
    assert host_notes("fp32", "f32", zen2) == host_notes("fp32", "f32", spr) == []
    (on_zen2,) = host_notes("int8", "int8 (QDQ)", zen2)
    assert "without VNNI/AMX" in on_zen2 and "u8u8" in on_zen2
    (on_spr,) = host_notes("int8", "int8 (QDQ)", spr)
    assert "with an int8 dot product" in on_spr and "without it" in on_spr
    bf16 = host_notes("fp16", "bf16", spr)
    assert len(bf16) == 1 and "bf16" in bf16[0] and "f32" in bf16[0]


def test_manifest_records_the_build_cpu_and_the_int8_kernel(models: dict[str, Path], tmp_path: Path) -> None:
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for i in range(32):  # a quarter is held out of calibration for parity: 8 samples, not 2
        np.save(calib / f"{i}.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", ConvertRequest(precision="int8", calib=calib))
    isa = cpu_isa()
    assert b.manifest["build_host"]["cpu"] == isa.to_json()
    par = b.manifest["parity"]
    assert par["host_notes"] == host_notes("int8", par["candidate"]["precision_used"], isa)
    details = par["candidate"]["details"]
    # the profile's default ("auto"): u8u8 only where this CPU's u8s8 would saturate, as its flags say
    assert details["x64_quant_precision"] is (not isa.int8_dot_product) and details["x64_quant_precision_why"]
    if "avx2" in isa.flags:
        expected = "u8s8, 32-bit dot product" if isa.int8_dot_product else "u8u8"
        assert details["int8_kernel"].startswith(expected), details


def test_x64_quant_precision_auto_follows_the_cpu_s_int8_dot_product() -> None:
    """u8u8 (x64quantprecision) only where u8s8 saturates; with VNNI/AMX u8s8 is exact and u8u8 only slower."""
    vnni = parse_cpuinfo("model name\t: Xeon\nflags\t\t: sse4_1 avx2 avx512f avx512_vnni\n")
    avx2 = parse_cpuinfo("model name\t: EPYC 7742\nflags\t\t: sse4_1 avx2\n")
    unknown = parse_cpuinfo("")
    assert x64_quant_precision("auto", vnni)[0] is False and "avx512_vnni" in x64_quant_precision("auto", vnni)[1]
    assert x64_quant_precision("auto", avx2)[0] is True
    assert x64_quant_precision("auto", unknown)[0] is True  # flags not readable: the exact way
    assert x64_quant_precision(True, vnni) == (True, "x64_quant_precision = true was set explicitly")
    assert x64_quant_precision(False, avx2)[0] is False
    with pytest.raises(EdgeError, match="true, false or"):
        x64_quant_precision("yes", avx2)


def test_u8s8_where_auto_chooses_it_computes_what_u8u8_computes(models: dict[str, Path], tmp_path: Path) -> None:
    """The default changes speed, never results: on this CPU the bundle's outputs with the option as "auto"
    chooses are those of the exact u8u8 path (bit for bit where u8s8 is exact: VNNI/AMX)."""
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", ConvertRequest(precision="int8", calib="random"))
    feeds = {b.io.inputs[0].name: np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    with b.open_runner() as auto, b.open_runner({"x64_quant_precision": True}) as exact:
        assert auto.info.details["x64_quant_precision"] is (not cpu_isa().int8_dot_product)
        assert exact.info.details["x64_quant_precision"] is True
        for name, got in auto.infer(feeds).items():
            np.testing.assert_array_equal(got, exact.infer(feeds)[name])

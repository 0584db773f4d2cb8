"""``.ci/cpu-flags``: the llama.cpp build .ci/install makes uses the CPU's vector units and
never an instruction the CPU lacks, fed here the ``/proc/cpuinfo`` of other CPUs (the
machine's own build is what .ci/install runs, and the integration tests run it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "cpu-flags"

ZEN3 = ("fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 popcnt aes xsave avx f16c bmi1 avx2 "
        "bmi2 vaes vpclmulqdq")
"""An AMD EPYC 7003 (Zen 3) under KVM: AVX2, no AVX-512."""
SAPPHIRE_RAPIDS = (ZEN3 + " avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512vbmi"
                   " avx512_vbmi2 avx512_vnni avx512_bitalg avx_vnni avx512_bf16 amx_bf16"
                   " amx_tile amx_int8")
"""An Intel Xeon 4th generation: AVX-512 with VNNI and BF16, and AMX."""
SKYLAKE_X = ZEN3 + " avx512f avx512dq avx512cd avx512bw avx512vl"
"""AVX-512 without VNNI, VBMI or BF16."""
SANDY_BRIDGE = "fpu sse sse2 ssse3 cx16 sse4_1 sse4_2 popcnt aes xsave avx"
"""AVX without AVX2, FMA or F16C."""


def options(tmp_path: Path, cpuinfo: str) -> dict[str, str]:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    printed = subprocess.run(["bash", str(SCRIPT), str(path)], capture_output=True,
                             text=True, check=True).stdout.split()
    assert all(option.startswith("-D") for option in printed)
    return dict(option[2:].split("=", 1) for option in printed)


def x86(flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: X\nflags\t\t: {flags}\nbogomips\t: 4890\n\n" \
           f"processor\t: 1\nflags\t\t: {flags}\n"


def enabled(found: dict[str, str]) -> set[str]:
    return {name for name, value in found.items() if value == "ON"}


def test_an_avx2_cpu_gets_avx2_and_no_avx512(tmp_path: Path) -> None:
    found = options(tmp_path, x86(ZEN3))
    assert found["GGML_NATIVE"] == "OFF"
    assert enabled(found) == {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA",
                              "GGML_F16C"}
    assert found["GGML_AVX512"] == "OFF"


def test_an_avx512_cpu_gets_its_extensions_and_never_amx(tmp_path: Path) -> None:
    found = options(tmp_path, x86(SAPPHIRE_RAPIDS))
    assert {"GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
            "GGML_AVX_VNNI", "GGML_AVX2"} <= enabled(found)
    assert found["GGML_AMX_TILE"] == found["GGML_AMX_INT8"] == found["GGML_AMX_BF16"] == "OFF"


@pytest.mark.parametrize(("flags", "off"), [
    (SKYLAKE_X, {"GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"}),
    (SANDY_BRIDGE, {"GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX512"}),
    # One of ggml's five AVX-512 flags missing: no AVX-512 at all (its -mavx512bw would run).
    (ZEN3 + " avx512f avx512dq avx512cd avx512vl avx512_vnni", {"GGML_AVX512",
                                                                 "GGML_AVX512_VNNI"}),
])
def test_an_instruction_set_the_cpu_lacks_is_off(tmp_path: Path, flags: str,
                                                   off: set[str]) -> None:
    found = options(tmp_path, x86(flags))
    assert not off & enabled(found)
    assert "GGML_AVX" in enabled(found)


def test_a_flag_is_matched_whole_not_as_a_prefix(tmp_path: Path) -> None:
    # "avx512f" must not be read off "avx512fp16" alone, nor "avx" off "avx2".
    found = options(tmp_path, x86("sse4_2 avx2 avx512fp16 avx512cd avx512vl avx512dq avx512bw"))
    assert found["GGML_AVX"] == "OFF"
    assert found["GGML_AVX512"] == "OFF"


def test_a_cpu_without_x86_flags_gets_the_portable_default(tmp_path: Path) -> None:
    found = options(tmp_path, "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve\n")
    assert found == {"GGML_NATIVE": "OFF"}

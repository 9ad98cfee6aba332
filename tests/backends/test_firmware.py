"""``edgekit firmware c-array``: the generated C/C++ compiles with the system compiler and holds the exact bytes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edge.backends.litert.firmware import array_name, write_c_array
from edge.errors import EdgeError, InputFileError
from tests.support.cli import assert_user_error, run_cli

pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install 'edgekit-ml[litert]')")
from tests.backends.test_litert import add_model  # noqa: E402

CHECK_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "{header}"

int main(int argc, char** argv) {{
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 10;
  static unsigned char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  if (n != {name}_len) {{ printf("length %zu != %u\n", n, {name}_len); return 11; }}
  if (memcmp(buf, {name}, n) != 0) {{ printf("bytes differ\n"); return 12; }}
  if (((uintptr_t){name}) % 16 != 0) {{ printf("not 16-byte aligned\n"); return 13; }}
  if (memcmp({name} + 4, "TFL3", 4) != 0) {{ printf("no TFL3 identifier\n"); return 14; }}
  printf("ok %u\n", {name}_len);
  return 0;
}}
"""


def _compile_and_run(tmp_path: Path, cc: Path, header: Path, name: str, model: Path, *, lang: str) -> str:
    main = tmp_path / "check_main.c"
    main.write_text(CHECK_MAIN.format(header=header.name, name=name))
    exe = tmp_path / "check"
    if lang == "c++":
        compiler = shutil.which("g++") or shutil.which("c++")
        if compiler is None:
            pytest.skip("no C++ compiler (g++) on PATH")
        cmd = [compiler, "-std=c++11", "-Wall", "-Werror", "-x", "c++", str(cc), "-x", "c++", str(main), "-o", str(exe)]
    else:
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            pytest.skip("no C compiler (gcc/cc) on PATH")
        cmd = [compiler, "-std=c11", "-Wall", "-Werror", str(cc), str(main), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp_path)
    out = subprocess.run([str(exe), str(model)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_cc_compiles_and_round_trips(tmp_path: Path) -> None:
    model = add_model(tmp_path / "mnv2-int8.model.tflite")
    res = write_c_array(model, tmp_path / "out" / "model_data.cc")
    assert res.name == "g_mnv2_int8_model_data"
    text = res.cc.read_text()
    assert "alignas(16) const unsigned char g_mnv2_int8_model_data[]" in text
    assert f"const unsigned int g_mnv2_int8_model_data_len = {model.stat().st_size};" in text
    assert res.sha256 in text
    out = _compile_and_run(tmp_path / "out", res.cc, res.header, res.name, model, lang="c++")
    assert out.strip() == f"ok {model.stat().st_size}"


def test_c_output_compiles_as_c11(tmp_path: Path) -> None:
    model = add_model(tmp_path / "kws.tflite")
    res = write_c_array(model, tmp_path / "kws_data.c", name="g_kws")
    assert "#include <stdalign.h>" in res.cc.read_text()
    _compile_and_run(tmp_path, res.cc, res.header, "g_kws", model, lang="c")


def test_array_names() -> None:
    assert array_name("model.tflite") == "g_model_data"
    assert array_name("person_detect.tflite") == "g_person_detect_model_data"
    assert array_name("My Model-v2.int8.tflite") == "g_my_model_v2_int8_model_data"
    assert array_name("2-stage.tflite") == "g_2_stage_model_data"


def test_bad_inputs(tmp_path: Path, models: dict[str, Path]) -> None:
    with pytest.raises(InputFileError, match="is not a TFLite flatbuffer"):
        write_c_array(models["tiny"], tmp_path / "x.cc")  # an ONNX file
    model = add_model(tmp_path / "m.tflite")
    with pytest.raises(EdgeError, match="over the flash budget of 100 bytes"):
        write_c_array(model, tmp_path / "x.cc", max_bytes=100)
    with pytest.raises(EdgeError, match="not a valid C identifier"):
        write_c_array(model, tmp_path / "x.cc", name="2bad")
    with pytest.raises(EdgeError, match="should end in .cc"):
        write_c_array(model, tmp_path / "x.txt")
    assert not (tmp_path / "x.cc").exists()


def test_cli(tmp_path: Path, models: dict[str, Path]) -> None:
    model = add_model(tmp_path / "vww.tflite")
    size = model.stat().st_size
    p = run_cli("firmware", "c-array", str(model), "-o", str(tmp_path / "fw" / "model_data.cc"), "--max-bytes", "1M")
    assert p.returncode == 0, p.stderr
    assert "g_vww_model_data" in p.stdout and (tmp_path / "fw" / "model_data.h").is_file()
    assert_user_error(
        run_cli("firmware", "c-array", str(model), "-o", str(tmp_path / "a.cc"), "--max-bytes", str(size - 1)),
        "over the flash budget",
        f"{size:,} bytes",
    )
    assert_user_error(
        run_cli("firmware", "c-array", str(models["tiny"]), "-o", str(tmp_path / "b.cc")), "is not a TFLite flatbuffer"
    )
    assert_user_error(run_cli("firmware", "c-array", str(model), "--max-bytes", "lots"), "bad --max-bytes")

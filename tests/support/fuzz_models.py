"""Malformed and odd model files, built in code and seeded (issue #23: no traceback from any fuzzed model).

Each builder writes one file (or a folder's worth) into a directory and returns the path a user would pass
to ``edgekit convert``. ONNX cases start from a small valid graph and break one thing each; TFLite cases
from a one-op flatbuffer written with LiteRT's own schema (object API); GGUF cases from a header written by
the ``gguf`` package. Random bytes come from ``numpy.random.default_rng(seed)``: the same seed, the same
files. Used by ``tests/pipeline/test_fuzz_models.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Builder = Callable[[Path, np.random.Generator], Path]


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto] | None = None,
    opset: int = 17,
    extra_opsets: list[onnx.OperatorSetIdProto] | None = None,
) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "fuzz", inputs, outputs, initializer=inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *(extra_opsets or [])])
    m.ir_version = 8
    return m


def _f(name: str, shape: list[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _conv_model(shape: list[int | str] = [1, 3, 16, 16]) -> onnx.ModelProto:  # noqa: B006 - read only
    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.1, np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return _model(nodes, [_f("x", shape)], [_f("y", [shape[0], 4, shape[2], shape[3]])], [w])


def valid_conv(d: Path, rng: np.random.Generator) -> Path:
    """The untouched base: must convert (a control that the harness itself works)."""
    return _save(_conv_model(), d / "valid_conv.onnx")


def onnx_truncated(d: Path, rng: np.random.Generator) -> Path:
    data = _conv_model().SerializeToString()
    cut = int(rng.integers(8, len(data) - 8))
    (d / "truncated.onnx").write_bytes(data[:cut])
    return d / "truncated.onnx"


def onnx_random_bytes(d: Path, rng: np.random.Generator) -> Path:
    (d / "random.onnx").write_bytes(b"\x08\x08\x12\x04fuzz" + rng.bytes(2048))  # starts like a ModelProto
    return d / "random.onnx"


def onnx_empty_file(d: Path, rng: np.random.Generator) -> Path:
    (d / "empty.onnx").write_bytes(b"")
    return d / "empty.onnx"


def onnx_no_graph(d: Path, rng: np.random.Generator) -> Path:
    m = onnx.ModelProto(ir_version=8, producer_name="fuzz")
    m.opset_import.append(helper.make_opsetid("", 17))
    return _save(m, d / "no_graph.onnx")


def onnx_no_opset(d: Path, rng: np.random.Generator) -> Path:
    m = _conv_model()
    del m.opset_import[:]
    return _save(m, d / "no_opset.onnx")


def onnx_unknown_domain(d: Path, rng: np.random.Generator) -> Path:
    nodes = [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example.fuzz")]
    m = _model(nodes, [_f("x", [1, 8])], [_f("y", [1, 8])], extra_opsets=[helper.make_opsetid("com.example.fuzz", 1)])
    return _save(m, d / "unknown_domain.onnx")


def onnx_unknown_op(d: Path, rng: np.random.Generator) -> Path:
    m = _model([helper.make_node("NoSuchOp", ["x"], ["y"])], [_f("x", [1, 8])], [_f("y", [1, 8])])
    return _save(m, d / "unknown_op.onnx")


def onnx_zero_dim(d: Path, rng: np.random.Generator) -> Path:
    return _save(_conv_model([1, 3, 0, 16]), d / "zero_dim.onnx")


def onnx_negative_dim(d: Path, rng: np.random.Generator) -> Path:
    return _save(_conv_model([1, 3, -5, 16]), d / "negative_dim.onnx")


def onnx_huge_dim(d: Path, rng: np.random.Generator) -> Path:
    return _save(_conv_model([1, 3, 1 << 40, 16]), d / "huge_dim.onnx")


def onnx_huge_total(d: Path, rng: np.random.Generator) -> Path:
    """Each dim plausible, the tensor 64 GB: must be refused before anything is allocated."""
    return _save(_conv_model([64, 3, 8192, 8192]), d / "huge_total.onnx")


def onnx_no_inputs(d: Path, rng: np.random.Generator) -> Path:
    c = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(1, 8), "c")
    m = _model([helper.make_node("Relu", ["c"], ["y"])], [], [_f("y", [1, 8])], [c])
    return _save(m, d / "no_inputs.onnx")


def onnx_no_outputs(d: Path, rng: np.random.Generator) -> Path:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_f("x", [1, 8])], [])
    return _save(m, d / "no_outputs.onnx")


def onnx_string_input(d: Path, rng: np.random.Generator) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.STRING, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [1, 4])
    return _save(_model([helper.make_node("Identity", ["x"], ["y"])], [x], [y]), d / "string_input.onnx")


def onnx_string_output(d: Path, rng: np.random.Generator) -> Path:
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [1, 8])
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING)], [_f("x", [1, 8])], [y])
    return _save(m, d / "string_output.onnx")


def onnx_cycle(d: Path, rng: np.random.Generator) -> Path:
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Identity", ["a"], ["y"]),
    ]
    return _save(_model(nodes, [_f("x", [1, 8])], [_f("y", [1, 8])]), d / "cycle.onnx")


def onnx_dangling_input(d: Path, rng: np.random.Generator) -> Path:
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["y"])]
    return _save(_model(nodes, [_f("x", [1, 8])], [_f("y", [1, 8])]), d / "dangling.onnx")


def onnx_duplicate_output(d: Path, rng: np.random.Generator) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
    return _save(_model(nodes, [_f("x", [1, 8])], [_f("y", [1, 8])]), d / "duplicate_output.onnx")


def onnx_nested_subgraphs(d: Path, rng: np.random.Generator) -> Path:
    """An If inside an If's branch, each branch reading the outer x: valid, must convert or refuse cleanly."""

    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], [name])], name, [], [_f(name, [1, 8])])

    inner = helper.make_node(
        "If", ["cond"], ["inner_out"], then_branch=branch("t2", "Relu"), else_branch=branch("e2", "Neg")
    )
    then_g = helper.make_graph([inner], "then1", [], [_f("inner_out", [1, 8])])
    outer = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=branch("e1", "Abs"))
    cond = numpy_helper.from_array(np.array(True), "cond")
    return _save(_model([outer], [_f("x", [1, 8])], [_f("y", [1, 8])], [cond]), d / "nested_if.onnx")


def onnx_external_outside(d: Path, rng: np.random.Generator) -> Path:
    """An initializer whose external data lies outside the model's folder (a path traversal)."""
    m = _conv_model()
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../../../../../../etc/passwd"), ("offset", "0"), ("length", "432")):
        w.external_data.append(onnx.StringStringEntryProto(key=k, value=v))
    sub = d / "ext_outside"
    sub.mkdir(exist_ok=True)
    return _save(m, sub / "external_outside.onnx")


def onnx_external_absolute(d: Path, rng: np.random.Generator) -> Path:
    m = _conv_model()
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.append(onnx.StringStringEntryProto(key="location", value="/etc/hostname"))
    return _save(m, d / "external_absolute.onnx")


def onnx_external_missing(d: Path, rng: np.random.Generator) -> Path:
    m = _conv_model()
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.append(onnx.StringStringEntryProto(key="location", value="weights.bin"))
    return _save(m, d / "external_missing.onnx")


def onnx_raw_data_short(d: Path, rng: np.random.Generator) -> Path:
    """An initializer whose raw bytes are fewer than its dims say."""
    m = _conv_model()
    w = m.graph.initializer[0]
    w.raw_data = w.raw_data[:100]
    return _save(m, d / "raw_data_short.onnx")


def onnx_future_opset(d: Path, rng: np.random.Generator) -> Path:
    m = _conv_model()
    m.opset_import[0].version = 999
    m.ir_version = 99
    return _save(m, d / "future_opset.onnx")


def onnx_odd_dtype(d: Path, rng: np.random.Generator) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.COMPLEX64, [1, 4])
    return _save(_model([helper.make_node("Identity", ["x"], ["y"])], [x], [_f("y", [1, 4])]), d / "complex.onnx")


def onnx_unknown_elem_type(d: Path, rng: np.random.Generator) -> Path:
    """An element type number no ONNX version defines (a flipped byte in a real file did this)."""
    m = _conv_model()
    m.graph.input[0].type.tensor_type.elem_type = 39
    return _save(m, d / "unknown_elem_type.onnx")


def onnx_symbolic_only(d: Path, rng: np.random.Generator) -> Path:
    return _save(_conv_model(["n", "c", "h", "w"]), d / "symbolic.onnx")


def onnx_rank_zero(d: Path, rng: np.random.Generator) -> Path:
    return _save(_model([helper.make_node("Relu", ["x"], ["y"])], [_f("x", [])], [_f("y", [])]), d / "scalar.onnx")


def onnx_bad_names(d: Path, rng: np.random.Generator) -> Path:
    """I/O names with control characters, markup and a path: printed escaped, never written as paths."""
    name = "../x\x1b[31m[red]\n"
    return _save(
        _model([helper.make_node("Relu", [name], ["y"])], [_f(name, [1, 8])], [_f("y", [1, 8])]), d / "bad_names.onnx"
    )


# -- TFLite ----------------------------------------------------------------------------------------


def _tflite_model() -> object:
    from ai_edge_litert import schema_py_generated as s

    m = s.ModelT()
    m.version = 3
    oc = s.OperatorCodeT()
    oc.builtinCode = oc.deprecatedBuiltinCode = s.BuiltinOperator.ADD
    oc.version = 1
    m.operatorCodes = [oc]
    empty, const = s.BufferT(), s.BufferT()
    const.data = np.arange(8, dtype=np.float32).tobytes()
    m.buffers = [empty, s.BufferT(), const, s.BufferT()]

    def tensor(name: str, buf: int) -> object:
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name.encode(), np.array([1, 8], np.int32), s.TensorType.FLOAT32, buf
        return t

    sg = s.SubGraphT()
    sg.tensors = [tensor("x", 1), tensor("c", 2), tensor("y", 3)]
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.AddOptions, s.AddOptionsT()
    sg.operators, sg.inputs, sg.outputs, sg.name = [op], [0], [2], b"main"
    m.subgraphs = [sg]
    m.description = b"fuzz"
    return m


def _tflite_bytes(m: object) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")  # type: ignore[attr-defined]
    return bytes(b.Output())


def _tflite(d: Path, name: str, mutate: Callable[[object], None] | None = None) -> Path:
    m = _tflite_model()
    if mutate is not None:
        mutate(m)
    (d / name).write_bytes(_tflite_bytes(m))
    return d / name


def tflite_valid(d: Path, rng: np.random.Generator) -> Path:
    return _tflite(d, "valid_add.tflite")


def tflite_truncated(d: Path, rng: np.random.Generator) -> Path:
    data = _tflite_bytes(_tflite_model())
    (d / "truncated.tflite").write_bytes(data[: int(rng.integers(16, len(data) - 16))])
    return d / "truncated.tflite"


def tflite_random_magic(d: Path, rng: np.random.Generator) -> Path:
    (d / "random.tflite").write_bytes(b"\x1c\x00\x00\x00TFL3" + rng.bytes(4096))
    return d / "random.tflite"


def tflite_bogus_buffer_offset(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        buf = m.buffers[2]  # type: ignore[attr-defined]
        buf.data, buf.offset, buf.size = None, 1 << 40, 32

    return _tflite(d, "bogus_offset.tflite", mutate)


def tflite_buffer_index_out_of_range(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        m.subgraphs[0].tensors[1].buffer = 999  # type: ignore[attr-defined]

    return _tflite(d, "buffer_index.tflite", mutate)


def tflite_tensor_index_out_of_range(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        m.subgraphs[0].operators[0].inputs = [0, 77]  # type: ignore[attr-defined]

    return _tflite(d, "tensor_index.tflite", mutate)


def tflite_io_index_out_of_range(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        m.subgraphs[0].inputs = [41]  # type: ignore[attr-defined]

    return _tflite(d, "io_index.tflite", mutate)


def tflite_unknown_builtin(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        oc = m.operatorCodes[0]  # type: ignore[attr-defined]
        oc.builtinCode, oc.deprecatedBuiltinCode = 4000, 127

    return _tflite(d, "unknown_builtin.tflite", mutate)


def tflite_opcode_index_out_of_range(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        m.subgraphs[0].operators[0].opcodeIndex = 9  # type: ignore[attr-defined]

    return _tflite(d, "opcode_index.tflite", mutate)


def tflite_negative_dim(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        for t in m.subgraphs[0].tensors:  # type: ignore[attr-defined]
            t.shape = np.array([1, -8], np.int32)

    return _tflite(d, "negative_dim.tflite", mutate)


def tflite_huge_dim(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        m.subgraphs[0].tensors[0].shape = np.array([1 << 20, 1 << 20], np.int32)  # type: ignore[attr-defined]

    return _tflite(d, "huge_dim.tflite", mutate)


def tflite_string_input(d: Path, rng: np.random.Generator) -> Path:
    from ai_edge_litert import schema_py_generated as s

    def mutate(m: object) -> None:
        m.subgraphs[0].tensors[0].type = s.TensorType.STRING  # type: ignore[attr-defined]

    return _tflite(d, "string_input.tflite", mutate)


def tflite_no_subgraph(d: Path, rng: np.random.Generator) -> Path:
    def mutate(m: object) -> None:
        m.subgraphs = []  # type: ignore[attr-defined]

    return _tflite(d, "no_subgraph.tflite", mutate)


# -- GGUF ------------------------------------------------------------------------------------------


def _gguf_bytes(d: Path, arch: str = "llama") -> bytes:
    import gguf

    p = d / ".base.gguf"
    w = gguf.GGUFWriter(str(p), arch)
    w.add_context_length(64)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = p.read_bytes()
    p.unlink()
    return data


def gguf_truncated(d: Path, rng: np.random.Generator) -> Path:
    data = _gguf_bytes(d)
    (d / "truncated.gguf").write_bytes(data[: int(rng.integers(8, 64))])
    return d / "truncated.gguf"


def gguf_random_magic(d: Path, rng: np.random.Generator) -> Path:
    (d / "random.gguf").write_bytes(b"GGUF" + rng.bytes(1024))
    return d / "random.gguf"


def gguf_huge_counts(d: Path, rng: np.random.Generator) -> Path:
    """A version-3 header claiming 2**62 tensors and key-values."""
    (d / "huge_counts.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1 << 62).to_bytes(8, "little") * 2)
    return d / "huge_counts.gguf"


def gguf_tiny_weights(d: Path, rng: np.random.Generator) -> Path:
    """A well-formed GGUF whose 'llama' has one tensor: llama.cpp must refuse it, edgekit say so in one line."""
    (d / "tiny_llama.gguf").write_bytes(_gguf_bytes(d))
    return d / "tiny_llama.gguf"


def other_random(d: Path, rng: np.random.Generator) -> Path:
    (d / "mystery.bin2").write_bytes(rng.bytes(512))
    return d / "mystery.bin2"


def xml_junk(d: Path, rng: np.random.Generator) -> Path:
    (d / "junk.xml").write_text(
        '<?xml version="1.0"?><net name="x"><layers><layer id="0" type="Parameter"/></layers></net>'
    )
    (d / "junk.bin").write_bytes(rng.bytes(64))
    return d / "junk.xml"


def zip_junk(d: Path, rng: np.random.Generator) -> Path:
    import zipfile

    with zipfile.ZipFile(d / "model.pt", "w") as z:
        z.writestr("archive/data.pkl", rng.bytes(64))
        z.writestr("archive/constants.pkl", b"")
    return d / "model.pt"


ONNX: dict[str, Builder] = {
    f.__name__: f
    for f in (
        valid_conv,
        onnx_truncated,
        onnx_random_bytes,
        onnx_empty_file,
        onnx_no_graph,
        onnx_no_opset,
        onnx_unknown_domain,
        onnx_unknown_op,
        onnx_zero_dim,
        onnx_negative_dim,
        onnx_huge_dim,
        onnx_huge_total,
        onnx_no_inputs,
        onnx_no_outputs,
        onnx_string_input,
        onnx_string_output,
        onnx_cycle,
        onnx_dangling_input,
        onnx_duplicate_output,
        onnx_nested_subgraphs,
        onnx_external_outside,
        onnx_external_absolute,
        onnx_external_missing,
        onnx_raw_data_short,
        onnx_future_opset,
        onnx_odd_dtype,
        onnx_unknown_elem_type,
        onnx_symbolic_only,
        onnx_rank_zero,
        onnx_bad_names,
    )
}
TFLITE: dict[str, Builder] = {
    f.__name__: f
    for f in (
        tflite_valid,
        tflite_truncated,
        tflite_random_magic,
        tflite_bogus_buffer_offset,
        tflite_buffer_index_out_of_range,
        tflite_tensor_index_out_of_range,
        tflite_io_index_out_of_range,
        tflite_unknown_builtin,
        tflite_opcode_index_out_of_range,
        tflite_negative_dim,
        tflite_huge_dim,
        tflite_string_input,
        tflite_no_subgraph,
    )
}
OTHER: dict[str, Builder] = {
    f.__name__: f
    for f in (gguf_truncated, gguf_random_magic, gguf_huge_counts, gguf_tiny_weights, other_random, xml_junk, zip_junk)
}
ALL: dict[str, Builder] = {**ONNX, **TFLITE, **OTHER}

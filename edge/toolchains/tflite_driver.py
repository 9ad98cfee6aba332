"""ONNX -> TFLite inside the ``tflite`` toolchain environment (onnx2tf + TensorFlow); and TFLite -> ONNX
with tf2onnx (a job whose ``task`` is ``"tflite->onnx"``: :func:`tflite_to_onnx`).

Run by :class:`edge.backends.litert.convert.OnnxToTFLite` as ``<toolchain>/venv/bin/python tflite_driver.py
job.json``. It must not import ``edge`` (edgekit is not installed in the toolchain environment)
and only uses the standard library plus the toolchain's own packages.

Protocol: one JSON object per line on the original stdout (``{"event": "stage" | "progress" |
"heartbeat" | "result" | "error", ...}``); everything else the libraries print (TensorFlow's
C++ logging included) goes to ``convert.log`` in the work directory.

What it does, and why (measured with onnx2tf 1.29.24 / TensorFlow 2.19):

* Every ONNX op is checked against onnx2tf's op modules first, so *all* unsupported ops are
  reported at once with their node names (onnx2tf stops at the first).
* onnx2tf writes over its input (it runs ``onnxsim in.onnx in.onnx``): it gets a copy.
* onnx2tf downloads a calibration sample from GitHub whenever every input is a 3-channel
  image, even for float conversion. The download function is replaced by local data. The
  run itself is offline: the parent starts this driver through ``edge.toolchains.offline_popen``
  (a network namespace where the host allows one, else an in-process socket guard loaded in
  every Python process of the run), so a conversion is offline or fails loudly.
* onnx2tf calls ``onnxsim`` through PATH and silently skips simplification when it fails or
  is absent; the parent puts the toolchain's ``bin`` first on PATH and this driver records
  every onnxsim run and its outcome.
* onnx2tf itself only builds the TensorFlow model (NHWC, saved as a SavedModel). The TFLite
  conversion is done here with ``TFLiteConverter.from_saved_model`` and builtin ops only (onnx2tf adds ``SELECT_TF_OPS``,
  whose Flex ops a device's LiteRT runtime cannot run), one precision at a time, with the
  caller's calibration samples as the representative dataset. onnx2tf's own ``-oiqt`` path
  writes six quantized variants (1 min 46 s for MobileNetV2); this one 4-5 s.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# the sibling module: imported as edge.toolchains.tflite_driver (tests) it is in the package; run as a script by the
# toolchain's Python (no edgekit there), from this file's directory (put first on the path: python -I leaves it off)
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
compare = importlib.import_module(f"{__package__}.tflite_compare" if __package__ else "tflite_compare")
fixes = importlib.import_module(f"{__package__}.tf2onnx_fixes" if __package__ else "tf2onnx_fixes")
output = importlib.import_module(f"{__package__}.driver_output" if __package__ else "driver_output")
failure = importlib.import_module(f"{__package__}.onnx2tf_failure" if __package__ else "onnx2tf_failure")

EVENTS = output.Events()
_STAGE: dict[str, Any] = {"name": "starting", "since": time.time()}
_ONNXSIM_RUNS: list[dict[str, Any]] = []


class DriverError(Exception):
    def __init__(self, kind: str, message: str, **data: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.data = data


emit = EVENTS.emit


def stage(name: str) -> None:
    _STAGE.update(name=name, since=time.time())
    emit("stage", stage=name)


def _heartbeat() -> None:
    while True:
        time.sleep(5.0)
        emit("heartbeat", stage=_STAGE["name"], stage_s=round(time.time() - _STAGE["since"], 1))


def _record_onnxsim() -> None:
    real = subprocess.check_output

    def check_output(args: Any, *a: Any, **kw: Any) -> Any:
        argv = list(args) if isinstance(args, (list, tuple)) else [str(args)]
        if argv and argv[0] == "onnxsim":
            run: dict[str, Any] = {"path": shutil.which("onnxsim")}
            t0 = time.time()
            try:
                out = real(args, *a, **kw)
                run.update(ok=True)
                return out
            except Exception as e:  # noqa: BLE001 - recorded, then re-raised for onnx2tf to handle
                err = getattr(e, "stderr", None) or b""
                run.update(ok=False, error=f"{type(e).__name__}: {err.decode(errors='replace')[-300:] or e}")
                raise
            finally:
                run["seconds"] = round(time.time() - t0, 2)
                _ONNXSIM_RUNS.append(run)
        return real(args, *a, **kw)

    subprocess.check_output = check_output


# -- ONNX side ---------------------------------------------------------------------------


def _all_nodes(graph: Any, prefix: str = "") -> list[Any]:
    out = []
    for node in graph.node:
        out.append((node, prefix))
        for attr in node.attribute:
            if attr.g is not None and attr.g.node:
                out += _all_nodes(attr.g, f"{prefix}{node.name or node.op_type}/")
            for g in attr.graphs:
                out += _all_nodes(g, f"{prefix}{node.name or node.op_type}/")
    return out


def unsupported_ops(onnx_path: Path) -> list[dict[str, str]]:
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    found = []
    for node, prefix in _all_nodes(model.graph):
        if importlib.util.find_spec(f"onnx2tf.ops.{node.op_type}") is None:
            found.append(
                {
                    "op": node.op_type,
                    "domain": node.domain or "ai.onnx",
                    "node": prefix + (node.name or f"<unnamed {node.op_type}>"),
                }
            )
    return found


#: characters a node name keeps: TensorFlow's scope names allow [A-Za-z0-9_.\\/>-] (onnx2tf already turns
#: ':' and a leading '/' into valid ones); anything else ("Softmax@0" from Paddle2ONNX) is replaced by '_'
_SCOPE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:>-")
#: ONNX ops onnx2tf translates to TensorFlow ops TFLite's builtins lack, and its own replacement for each
#: (replace_to_pseudo_operators): Erf -> Abramowitz-Stegun 7.1.26 (max abs error 1.5e-7, below fp32 parity's
#: tolerance) built from Abs/Exp/Mul/Add/Div. A GELU onnx2tf recognises (x / sqrt(2) -> Erf -> +1 -> *x -> *0.5)
#: becomes tf.nn.gelu (the TFLite GELU builtin) whatever this says.
_PSEUDO_OPS = ("Erf",)


def prepare_source(src: Path, dst: Path) -> dict[str, Any]:
    """Copy ``src`` to ``dst`` (onnx2tf writes over its input) with node names TensorFlow accepts as scope
    names, and say which ops onnx2tf should replace by builtin-only equivalents. Tensor names are kept: the
    I/O map and the error messages' ONNX names go by them."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    renamed: list[str] = []
    taken = {n.name for n, _ in _all_nodes(model.graph)}
    for node, _prefix in _all_nodes(model.graph):
        if node.name and not set(node.name) <= _SCOPE_CHARS:
            new = "".join(c if c in _SCOPE_CHARS else "_" for c in node.name)
            while new in taken:
                new += "_"
            taken.add(new)
            renamed.append(f"{node.name} -> {new}")
            node.name = new
    ops: dict[str, int] = {}
    for node, _prefix in _all_nodes(model.graph):
        if node.op_type in _PSEUDO_OPS and node.domain in ("", "ai.onnx"):
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    if renamed:
        onnx.save(model, str(dst))
    else:
        shutil.copyfile(src, dst)
    return {"renamed_nodes": len(renamed), "renamed_examples": renamed[:3], "pseudo_operators": ops}


def _local_test_images() -> Any:
    """What onnx2tf would download (20 normalised 128x128 RGB images): deterministic local pictures."""
    import numpy as np

    rng = np.random.default_rng(20)
    yy, xx = np.mgrid[0:128, 0:128] / 127.0
    imgs = np.empty((20, 128, 128, 3), np.float32)
    for i in range(20):
        c = rng.uniform(0.2, 0.8, 3)
        s = rng.uniform(-0.4, 0.4, (2, 3))
        imgs[i] = np.clip(
            c + s[0] * xx[..., None] + s[1] * yy[..., None] + 0.1 * rng.standard_normal((128, 128, 3)), 0.0, 1.0
        )
    return imgs


# -- layouts -----------------------------------------------------------------------------


def map_io(
    job: dict[str, Any],
    keras_model: Any,
    signature: tuple[dict[str, list[int]], dict[str, list[int]]],
    onnx_path: Path,
    sample: dict[str, Any],
) -> dict[str, Any]:
    """ONNX tensor -> Keras/TFLite signature name and layout permutation, for every input and output.

    Names: exact, then onnx2tf's sanitising (``tflite_compare.onnx2tf_name``: ':' -> '__', a leading '/' -> 'wa/'),
    then a unique shape match; outputs then take their serving-signature name (output_<i>). A permutation is ambiguous only when identity and channels-last give the same
    shape; then both are tried against onnxruntime on one sample.
    """
    tf_inputs = {t.name.split(":")[0]: [int(d) for d in t.shape] for t in keras_model.inputs}
    tf_outputs = {n: [int(d) for d in t.shape] for n, t in zip(keras_model.output_names, keras_model.outputs)}
    sig_name = _signature_names(tf_inputs, tf_outputs, signature)
    inputs = _match_io("input", job["inputs"], tf_inputs)
    outputs = _match_io("output", job["outputs"], tf_outputs)
    if any(len(t["perms"]) > 1 for t in inputs + outputs):
        _choose_perms(inputs, outputs, list(tf_inputs), keras_model, onnx_path, sample)
    for t in inputs + outputs:
        t["perm_onnx_to_tflite"] = t.pop("perms")[0]
    for t in outputs:
        t["keras_name"], t["tflite_name"] = t["tflite_name"], sig_name[t["tflite_name"]]
    return {"inputs": inputs, "outputs": outputs}


def signature_arg_name(name: str) -> str:
    """The name TensorFlow gives a Keras input in a SavedModel signature (``sanitize_arg_name`` in
    tensorflow/core/function/polymorphism/function_type_utils.py): every character that is not alphanumeric
    becomes '_', and a name that does not start with a letter gets ``arg_`` in front. onnx2tf's ``wa/feat/x``
    (ONNX ``/feat/x``) is the signature's ``wa_feat_x``."""
    swapped = "".join(c if c.isalnum() else "_" for c in name)
    return swapped if swapped[:1].isalpha() else "arg_" + swapped


def _signature_names(
    tf_inputs: dict[str, list[int]],
    tf_outputs: dict[str, list[int]],
    signature: tuple[dict[str, list[int]], dict[str, list[int]]],
) -> dict[str, str]:
    """Keras output name -> its serving-signature name. The SavedModel's serving signature (what the TFLite
    conversion reads) names inputs like the Keras model, sanitised as TensorFlow sanitises argument names
    (:func:`signature_arg_name`; the .tflite's signature keeps the Keras name), and outputs output_0,
    output_1, ... in the Keras model's output order; checked here."""
    sig_in, sig_out = signature
    for n, shape in tf_inputs.items():
        if sig_in.get(n if n in sig_in else signature_arg_name(n)) != shape:
            raise DriverError(
                "io_mapping", f"the SavedModel signature does not have Keras input {n!r} {shape} (it has {sig_in})"
            )
    sig_name = {}
    for i, (n, shape) in enumerate(tf_outputs.items()):
        key = f"output_{i}"
        if sig_out.get(key) != shape:
            raise DriverError(
                "io_mapping",
                f"the SavedModel signature output {key} is not Keras output {n!r} {shape} (signature outputs: {sig_out})",
            )
        sig_name[n] = key
    return sig_name


def _match_io(kind: str, onnx_specs: list[dict[str, Any]], tf_specs: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Each ONNX tensor's TensorFlow name (exact, sanitised, else the one unused tensor of a fitting shape) and
    the layout permutations that fit."""

    out, used = [], set()
    for spec in onnx_specs:
        name = spec["name"]
        key = next((k for k in (name, compare.onnx2tf_name(name)) if k in tf_specs and k not in used), None)
        if key is None:
            same = [k for k, s in tf_specs.items() if k not in used and compare.candidate_perms(spec["shape"], s)]
            if len(same) != 1:
                raise DriverError(
                    "io_mapping",
                    f"cannot tell which TensorFlow {kind} is ONNX {kind} {name!r} (TensorFlow {kind}s: {tf_specs})",
                )
            key = same[0]
        used.add(key)
        perms = compare.candidate_perms(spec["shape"], tf_specs[key])
        if not perms:
            raise DriverError(
                "io_mapping",
                f"ONNX {kind} {name!r} {spec['shape']} became {tf_specs[key]} in TensorFlow, which is not a layout change edgekit can undo",
            )
        out.append(
            {
                "name": name,
                "tflite_name": key,
                "onnx_shape": spec["shape"],
                "tflite_shape": tf_specs[key],
                "perms": perms,
            }
        )
    return out


def _choose_perms(
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    tf_input_order: list[str],
    keras_model: Any,
    onnx_path: Path,
    sample: dict[str, Any],
) -> None:
    """Where a layout is ambiguous, the permutations whose Keras outputs match onnxruntime's on ``sample`` best."""
    import itertools

    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, sample)))
    best: tuple[float, Any] | None = None
    for choice in itertools.product(*[t["perms"] for t in inputs]):
        by_tf = {
            t["tflite_name"]: np.ascontiguousarray(np.asarray(sample[t["name"]]).transpose(p))
            for t, p in zip(inputs, choice)
        }
        feeds = [by_tf[k] for k in tf_input_order]
        res = keras_model(feeds if len(feeds) > 1 else feeds[0], training=False)
        res = res if isinstance(res, (list, tuple)) else [res]
        by_name = dict(zip(keras_model.output_names, [np.asarray(r) for r in res]))
        score, outs = 0.0, []
        for t in outputs:
            inv_scores = []
            for p in t["perms"]:
                inv = list(np.argsort(p))
                inv_scores.append((compare.cosine(by_name[t["tflite_name"]].transpose(inv), ref[t["name"]]), p))
            s, p = max(inv_scores, key=lambda x: x[0])
            score += s
            outs.append(p)
        if best is None or score > best[0]:
            best = (score, (list(choice), outs))
    if best is None:  # itertools.product always yields once: every input has at least one permutation
        raise DriverError("io_mapping", "no layout permutation to try")
    for t, p in zip(inputs, best[1][0]):
        t["perms"] = [p]
    for t, p in zip(outputs, best[1][1]):
        t["perms"] = [p]


# -- TFLite conversion -------------------------------------------------------------------


def _onnx_node_index(onnx_path: Path) -> dict[str, tuple[str, str]]:
    """Node names and output tensor names (also as onnx2tf sanitises them) -> (ONNX node name, op type)."""
    import onnx

    index: dict[str, tuple[str, str]] = {}
    model = onnx.load(str(onnx_path), load_external_data=False)
    for node, _prefix in _all_nodes(model.graph):
        entry = (node.name or node.op_type, node.op_type)
        for key in [node.name, *node.output]:
            if key:
                index.setdefault(key, entry)
                index.setdefault(key.replace(":", "_").lstrip("/"), entry)
    return index


def _onnx_origin(tf_node: str, index: dict[str, tuple[str, str]]) -> str | None:
    """onnx2tf names TensorFlow ops after the ONNX tensors they compute: model/<tensor>/<TF op>@..."""
    parts = tf_node.split("@", 1)[0].split("/")
    for part in reversed(parts[:-1] if len(parts) > 1 else parts):
        if part in index:
            name, op = index[part]
            return f"ONNX node {name} ({op})"
    return None


def _converter_error(e: Exception, onnx_path: Path | None = None) -> DriverError:
    """Name the TensorFlow ops (and their nodes) that TFLite's builtin op set cannot express."""
    import re

    msg = str(e)
    ops: list[dict[str, str]] = []
    for err in getattr(e, "errors", []) or []:
        op = getattr(getattr(err, "operator", None), "name", "") or ""
        loc = str(getattr(err, "location", "") or "")
        nodes = re.findall(r'name: "([^"]+)"', loc) or re.findall(r'loc\("([^"]+)"', loc)
        if op:
            ops.append({"op": op, "node": nodes[0] if nodes else "?"})
    if not ops:
        for m in re.finditer(r"'?tf\.(\w+)'?[^\n]*?(?:loc\((?:fused\[)?\"([^\"]+)\")?", msg):
            ops.append({"op": m.group(1), "node": m.group(2) or "?"})
    seen: set[tuple[str, str]] = set()
    uniq: list[dict[str, Any]] = []  # and each one's ONNX node, or None
    for o in ops:
        k = (o["op"], o["node"])
        if k not in seen:
            seen.add(k)
            uniq.append(o)
    if uniq or "not supported by the native TFLite runtime" in msg or "Flex" in msg:
        index = {}
        if onnx_path is not None:
            try:
                index = _onnx_node_index(onnx_path)
            except Exception:  # noqa: BLE001 - naming the ONNX node is a courtesy
                pass
        for u in uniq:
            u["onnx_node"] = _onnx_origin(u["node"], index)
        return DriverError(
            "tflite_unsupported_ops",
            "TFLite's builtin op set cannot express "
            + (
                ", ".join(
                    f"tf.{o['op'].removeprefix('tf.')} (from {o['onnx_node'] or 'TF node ' + o['node']})" for o in uniq
                )
                or msg.splitlines()[0][:300]
            ),
            ops=uniq,
            detail=msg[-2000:],
        )
    return DriverError("tflite_converter", f"TFLiteConverter failed: {type(e).__name__}: {msg[-1500:]}")


def saved_model_signature(saved_model: Path) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    import tensorflow as tf

    sig = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    ins = {k: [int(d) for d in v.shape] for k, v in sig.structured_input_signature[1].items()}
    outs = {k: [int(d) for d in v.shape] for k, v in sig.structured_outputs.items()}
    return ins, outs


def to_tflite(job: dict[str, Any], saved_model: Path, io_map: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """From the SavedModel, not the Keras model: full-int8 calibration of MobileNetV2 took 4.8 s from the
    SavedModel and 20 s from ``from_keras_model`` (same 32 samples, same result size)."""
    import numpy as np
    import tensorflow as tf

    precision = job["precision"]
    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=["serving_default"])
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    details: dict[str, Any] = {}
    if precision == "fp16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
        details["recipe"] = "float16 weights (dequantized to float32 at load, or computed in fp16 where XNNPack can)"
    elif precision == "int8-dynamic":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        details["recipe"] = "dynamic-range int8: int8 weights, activations quantized on the fly"
    elif precision == "int8":
        calib = np.load(job["calibration"], allow_pickle=False)
        n = int(next(iter(calib.values())).shape[0]) if calib.files else 0
        if n == 0:
            raise DriverError("calibration", "full-integer int8 needs calibration samples; none were given")
        arrays = {t["name"]: calib[t["name"]] for t in io_map["inputs"]}

        def representative() -> Any:
            for i in range(n):
                emit("progress", stage="calibrating", done=i, total=n)
                yield {
                    t["tflite_name"]: np.ascontiguousarray(arrays[t["name"]][i].transpose(t["perm_onnx_to_tflite"]))
                    for t in io_map["inputs"]
                }
            emit("progress", stage="calibrating", done=n, total=n)

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        io_dtype = job.get("io_dtype", "int8")
        if io_dtype != "float32":
            conv.inference_input_type = getattr(tf, io_dtype)
            conv.inference_output_type = getattr(tf, io_dtype)
        if not job.get("per_channel", True):
            conv._experimental_disable_per_channel = True
        details.update(
            recipe="full-integer int8 (post-training, TFLITE_BUILTINS_INT8)",
            io_dtype=io_dtype,
            per_channel=bool(job.get("per_channel", True)),
            calibration_samples=n,
        )
    else:
        details["recipe"] = "float32"
    try:
        model = conv.convert()
    except Exception as e:  # noqa: BLE001 - classified for the user
        raise _converter_error(e, Path(job["onnx"])) from e
    return model, details


def inspect_tflite(path: Path) -> dict[str, Any]:
    import collections

    import tensorflow as tf

    it = tf.lite.Interpreter(
        model_path=str(path),
        experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    it.allocate_tensors()
    ops = collections.Counter(o["op_name"] for o in it._get_ops_details())
    return {"ops": dict(sorted(ops.items())), "op_count": sum(ops.values())}


def tflite_to_onnx(job: dict[str, Any]) -> dict[str, Any]:
    """TFLite -> ONNX with tf2onnx (``job["task"] == "tflite->onnx"``). tf2onnx writes a model even when it
    cannot translate an op (it keeps a ``TFL_<op>`` node): every such node is reported at once instead."""
    import onnx
    import tf2onnx

    stage("tf2onnx: TFLite -> ONNX")
    fixes.keep_fully_connected_bias()  # tf2onnx 1.17.0 drops a flattening FULLY_CONNECTED's bias
    out = Path(job["workdir"]) / "model.onnx"
    try:
        model, _ = tf2onnx.convert.from_tflite(job["tflite"], opset=int(job.get("opset", 17)), output_path=str(out))
    except Exception as e:  # noqa: BLE001
        raise DriverError("tf2onnx", f"tf2onnx failed: {type(e).__name__}: {str(e)[:800]}") from e
    # what tf2onnx left untranslated: TFL_<op> nodes, or a default-domain op ONNX does not define (a contrib op in
    # another domain, e.g. com.microsoft, is tf2onnx's own choice and onnxruntime runs it)
    nodes: dict[tuple[str, str], list[str]] = {}
    for n in model.graph.node:
        if n.op_type.startswith("TFL_") or (n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)):
            nodes.setdefault((n.op_type.removeprefix("TFL_"), n.domain or "ai.onnx"), []).append(n.name)
    if nodes:
        raise DriverError(
            "unsupported_ops",
            "tf2onnx cannot translate TFLite op(s) " + ", ".join(op for op, _ in sorted(nodes)),
            ops=[{"op": op, "domain": d, "nodes": names[:3]} for (op, d), names in sorted(nodes.items())],
        )
    import tensorflow as tf

    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {
        "artifact": str(out),
        "details": {"opset": int(job.get("opset", 17)), "onnx_ops": dict(sorted(ops.items()))},
        "tool_versions": {"tf2onnx": tf2onnx.__version__, "tensorflow": tf.__version__, "onnx": onnx.__version__},
    }


def _onnx2tf(
    job: dict[str, Any], src: Path, work: Path, prepared: dict[str, Any], extra: dict[str, Any] | None = None
) -> Any:
    """onnx2tf: the prepared ONNX to a Keras model and a SavedModel in ``work/saved_model`` (``extra``: more of
    onnx2tf.convert's arguments)."""
    import onnx2tf

    log = work / "convert.log"
    log_start = log.stat().st_size if log.is_file() else 0
    try:
        keras_model = onnx2tf.convert(
            **(extra or {}),
            input_onnx_file_path=str(src),
            output_folder_path=str(work / "saved_model"),
            output_signaturedefs=True,
            non_verbose=False,
            verbosity="warn",
            # onnx2tf's API compares lower-case names (its CLI lower-cases them)
            replace_to_pseudo_operators=sorted(op.lower() for op in prepared["pseudo_operators"]),
            # inputs that are no image (audio, recurrent state) keep their layout
            keep_shape_absolutely_input_names=job.get("keep_shape_inputs") or None,
            # image inputs the ONNX graph already takes channels-last stay so (not read as NCHW)
            keep_nwc_or_nhwc_or_ndhwc_input_names=job.get("keep_nhwc_inputs") or None,
            # edgekit folded the graph's constants itself (edge.graph.lower): onnxsim would
            # merge per-axis Slices into full-rank ones onnx2tf mistranslates
            not_use_onnxsim=bool(job.get("no_onnxsim", False)),
        )
    except SystemExit as e:  # onnx2tf logged why and exited: the node and that reason, in one line
        with open(log, "rb") as f:
            f.seek(log_start)
            kind, message, data = failure.exit_error(e, f.read().decode("utf-8", "replace"))
        raise DriverError(kind, message, **data) from None
    except Exception as e:  # noqa: BLE001
        kind, message, data = failure.node_error(e)
        raise DriverError(kind, message, **data) from e
    if keras_model is None:
        raise DriverError("onnx2tf", "onnx2tf returned no model; see the log")
    return keras_model


def _sanitize_inputs(path: Path) -> dict[str, str]:
    """Renames ``path``'s inputs as onnx2tf names its Keras inputs (':' -> '_', no leading '/'): its check feeds the
    caller's data by one name to both onnxruntime and TensorFlow. Old name -> new, for those renamed."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    renamed = {
        vi.name: vi.name.replace(":", "_").lstrip("/")
        for vi in model.graph.input
        if vi.name not in inits and vi.name.replace(":", "_").lstrip("/") != vi.name
    }
    if renamed:
        for vi in model.graph.input:
            vi.name = renamed.get(vi.name, vi.name)
        for node, _prefix in _all_nodes(model.graph):
            for k, i in enumerate(node.input):
                if i in renamed:
                    node.input[k] = renamed[i]
        onnx.save(model, str(path))
    return renamed


def node_check(job: dict[str, Any], work: Path, timings: dict[str, float]) -> dict[str, Any]:
    """``task == "onnx2tf-check"``: convert ``job["onnx"]`` again with onnx2tf's per-node check
    (check_onnx_tf_outputs_elementwise_close_full) on the caller's one sample (``job["sample_files"]``: ONNX input
    name -> .npy in the TensorFlow input's layout), and compare every node's ONNX and TensorFlow values in node order
    (:func:`compare_node_outputs`). onnx2tf's own verdict (an absolute tolerance of 1e-4, printed) is not used:
    its pairs are taken as they reach onnx_tf_tensor_validation."""
    t0 = time.time()
    src, prepared = _setup(job, work, timings, t0)
    from onnx2tf import onnx2tf as o2t

    pairs: dict[str, tuple[Any, Any]] = {}

    def capture(*, output_pairs: dict[tuple[str, str], tuple[Any, Any]], **_: Any) -> dict[str, Any]:
        for (onnx_name, _tf_name), values in output_pairs.items():
            pairs[onnx_name] = values  # by onnx2tf's name for the tensor: compare.onnx2tf_name
        return {}

    o2t.onnx_tf_tensor_validation = capture
    stage("onnx2tf: ONNX -> TensorFlow, every node checked against onnxruntime")
    renamed = _sanitize_inputs(src)
    extra = {
        "check_onnx_tf_outputs_elementwise_close_full": True,
        "custom_input_op_name_np_data_path": [[renamed.get(k, k), v] for k, v in job["sample_files"].items()],
    }
    _onnx2tf(job, src, work, prepared, extra)
    timings["check_s"] = round(time.time() - t0, 2)
    if not pairs:
        raise DriverError("onnx2tf_check", "onnx2tf compared no tensors (onnxruntime could not run the graph?)")
    # the graph onnx2tf translated (simplified in place by onnxsim, unnamed nodes named), by the names the caller gave
    given = {t: node for t, node, _op in compare.node_order(Path(job["onnx"]))[0] if not node.startswith("node ")}
    order, consumers = compare.node_order(src)
    order = [(t, given.get(t, node), op) for t, node, op in order]
    by_onnx = {t: pairs[compare.onnx2tf_name(t)] for t, _node, _op in order if compare.onnx2tf_name(t) in pairs}
    result = compare.compare_node_outputs(
        by_onnx,
        order,
        consumers,
        rel_tolerance=float(job["rel_tolerance"]),
        min_cosine=float(job["min_cosine"]),
        abs_floor=float(job["abs_floor"]),
    )
    return {**result, "pairs": len(pairs)}


def _prepared_details(prepared: dict[str, Any]) -> dict[str, Any]:
    """What preparing the source changed, for the conversion's details: pseudo-operators, renamed nodes."""
    details: dict[str, Any] = {}
    if prepared["pseudo_operators"]:
        details["pseudo_operators"] = {
            op: f"{n} node(s) built from TFLite builtins by onnx2tf (replace_to_pseudo_operators)"
            + (": Abramowitz-Stegun 7.1.26, max abs error 1.5e-7" if op == "Erf" else "")
            for op, n in prepared["pseudo_operators"].items()
        }
    if prepared["renamed_nodes"]:
        details["renamed_nodes"] = (
            f"{prepared['renamed_nodes']} ONNX node name(s) TensorFlow refuses as scope "
            f"names, renamed for onnx2tf (e.g. {prepared['renamed_examples'][0]})"
        )
    return details


def _tool_versions() -> dict[str, str]:
    import numpy as np
    import onnx
    import onnx2tf
    import tensorflow as tf

    versions = {
        "onnx2tf": onnx2tf.__version__,
        "tensorflow": tf.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
    }
    for mod in ("onnxsim", "onnxruntime", "tf_keras"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - informational
            pass
    return versions


def _setup(job: dict[str, Any], work: Path, timings: dict[str, float], t0: float) -> tuple[Path, dict[str, Any]]:
    """Refuse ops onnx2tf lacks, copy and prepare the source, patch onnx2tf's downloads, require onnxsim.

    Returns the prepared copy's path and what preparing it did; records ``setup_s`` from ``t0``.
    """
    stage("checking ONNX ops against onnx2tf")
    bad = unsupported_ops(Path(job["onnx"]))
    if bad:
        raise DriverError(
            "unsupported_ops",
            "onnx2tf cannot convert " + ", ".join(f"{b['op']} (node {b['node']})" for b in bad),
            ops=bad,
        )
    src = work / "source.onnx"
    prepared = prepare_source(Path(job["onnx"]), src)  # a copy: onnx2tf simplifies its input in place

    import numpy as np  # noqa: F401 - imported before onnx2tf, as the run always has
    from onnx2tf import onnx2tf as o2t
    from onnx2tf.utils import common_functions

    o2t.download_test_image_data = _local_test_images
    common_functions.download_test_image_data = _local_test_images
    _record_onnxsim()
    if shutil.which("onnxsim") is None:
        raise DriverError(
            "toolchain",
            "onnxsim is not on PATH inside the toolchain run; onnx2tf would skip simplification silently",
            hint="reinstall: edgekit toolchain install tflite --force",
        )
    timings["setup_s"] = round(time.time() - t0, 2)
    return src, prepared


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    work = Path(job["workdir"])
    EVENTS.stream, log = output.redirect_output(work)  # noqa: F841 - the log kept open for the run
    threading.Thread(target=_heartbeat, daemon=True).start()
    timings: dict[str, float] = {}
    try:
        t0 = time.time()
        if job.get("task") == "tflite->onnx":
            emit("result", **tflite_to_onnx(job), timings={"tf2onnx_s": round(time.time() - t0, 2)})
            return 0
        if job.get("task") == "onnx2tf-check":
            emit("result", **node_check(job, work, timings), timings=timings)
            return 0
        src, prepared = _setup(job, work, timings, t0)
        import numpy as np

        stage("onnx2tf: ONNX -> TensorFlow (NHWC)")
        t0 = time.time()
        keras_model = _onnx2tf(job, src, work, prepared)
        timings["onnx2tf_s"] = round(time.time() - t0, 2)

        calib = np.load(job["samples"], allow_pickle=False)
        sample = {k: calib[k][0] for k in calib.files}
        stage("mapping inputs/outputs and layouts")
        saved_model = work / "saved_model"
        io_map = map_io(job, keras_model, saved_model_signature(saved_model), Path(job["onnx"]), sample)

        stage(f"TFLite conversion ({job['precision']})")
        t0 = time.time()
        model, details = to_tflite(job, saved_model, io_map)
        out = work / "model.tflite"
        out.write_bytes(model)
        timings["tflite_s"] = round(time.time() - t0, 2)
        stage("checking the .tflite loads with builtin kernels")
        details.update(inspect_tflite(out))
        details.update(_prepared_details(prepared))
        emit(
            "result",
            artifact=str(out),
            io=io_map,
            details=details,
            tool_versions=_tool_versions(),
            onnxsim=_ONNXSIM_RUNS,
            timings=timings,
        )
        return 0
    except DriverError as e:
        emit("error", kind=e.kind, message=str(e), **e.data)
        return 3
    except BaseException as e:  # noqa: BLE001 - reported to the parent, with the traceback in the log
        traceback.print_exc()
        emit("error", kind="internal", message=f"{type(e).__name__}: {str(e)[:1000]}")
        return 4
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())

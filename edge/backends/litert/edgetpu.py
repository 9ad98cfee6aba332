"""Full-integer TFLite -> Edge TPU TFLite with Google's ``edgetpu_compiler``.

The compiler exists for x86-64 Linux only and is not on PyPI (Coral's apt repository:
``edgetpu-compiler``). When it is on PATH it compiles ``model.tflite`` into
``model_edgetpu.tflite`` and its log (``model_edgetpu.log``) says, per op type, whether it was
mapped to the Edge TPU or left on the CPU and why; both counts go into the manifest. When it
is absent the converter says exactly that, keeps the ready full-integer ``model.tflite`` as the
bundle's artifact (format ``tflite``), and records the command that finishes the job on a
machine that has the compiler (``details["finish_with"]``: ``edgekit finish BUNDLE``; also a note the
CLI prints). ``require_compiler = true`` makes its absence an error instead.

:func:`finish_bundle` is that command: the same compiler run (:func:`compile_model`) on the verified
bundle's int8 model, written as a new, re-hashed bundle whose chain records the step. Running the
compiler by hand in the bundle would add unhashed files the manifest does not point at.

The compiled bundle keeps the int8 ``model.tflite`` beside ``model_edgetpu.tflite`` (its
``io.json`` names it as ``cpu_model``): a compiled model cannot run without the Edge TPU, and
the runner's explicit CPU fallback needs something to run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.backends.litert.format import EDGETPU_CUSTOM_OP as EDGETPU_OP
from edge.backends.litert.format import load_sidecar
from edge.base.hashing import sha256_file
from edge.base.typedjson import Rule, spec, write_json_atomic
from edge.errors import BundleError, ConversionError, MissingDependencyError, PrecisionError, TargetError

COMPILER = "edgetpu_compiler"
COMPILER_INSTALL = (
    "edgetpu_compiler runs on x86-64 Linux only; install it from Coral's apt repository "
    "(https://coral.ai/docs/edgetpu/compiler/: apt-get install edgetpu-compiler)"
)
_MAPPED = "Mapped to Edge TPU"


def parse_compiler_log(text: str) -> dict[str, Any]:
    """The op table and summary lines of an edgetpu_compiler log/stdout.

    Table rows look like ``CONV_2D    35    Mapped to Edge TPU`` or
    ``MEAN   1   Operation is otherwise supported, but not mapped due to some unspecified limitation``;
    the summary says ``Number of operations that will run on Edge TPU: 65``.
    """
    rows = []
    for line in text.splitlines():
        m = re.fullmatch(r"\s*([A-Z][A-Z0-9_]*)\s+(\d+)\s+(\S.*?)\s*", line)
        if m and m.group(1) not in ("Operator",):
            rows.append(
                {
                    "op": m.group(1),
                    "count": int(m.group(2)),
                    "status": m.group(3),
                    "on": "tpu" if m.group(3).startswith(_MAPPED) else "cpu",
                }
            )
    tpu = re.search(r"operations that will run on Edge TPU:\s*(\d+)", text)
    cpu = re.search(r"operations that will run on CPU:\s*(\d+)", text)
    version = re.search(r"Edge TPU Compiler version\s+(\S+)", text)
    return {
        "compiler_version": version.group(1) if version else None,
        "tpu_ops": int(tpu.group(1)) if tpu else sum(r["count"] for r in rows if r["on"] == "tpu"),
        "cpu_ops": int(cpu.group(1)) if cpu else sum(r["count"] for r in rows if r["on"] == "cpu"),
        "ops": rows,
    }


@dataclass(frozen=True)
class EdgeTPUOptions:
    """``tflite->edgetpu``'s options (the compiler run), declared once (``edge.backends.options``); ``edgekit firmware
    edgetpu``'s finishing step reads the target profile's through it too."""

    compiler: str | None = spec(
        None, min_len=1, max_len=4096, doc=f"edgetpu_compiler to run (default: {COMPILER} on PATH)"
    )
    require_compiler: bool = spec(
        False, doc="fail when edgetpu_compiler is missing instead of keeping the uncompiled int8 model (default false)"
    )
    extra_args: tuple[str, ...] = spec(
        (), max_items=64, item=Rule(max_len=1024), doc='more compiler arguments, e.g. ["--num_segments", "2"]'
    )
    timeout_s: float = spec(600.0, ge=1.0, le=7 * 86400, doc="stop the compiler after this many seconds (default 600)")


class TFLiteToEdgeTPU(Converter):
    name = "tflite->edgetpu"
    source_format = "tflite"
    target_format = "edgetpu-tflite"
    precisions = frozenset({"int8"})
    # No hard requirement: without the compiler the ready int8 model is kept and the finishing command recorded.
    requires = ()
    options_class = EdgeTPUOptions  # ``options`` (names and descriptions) derive from it
    full_integer_only = "the Edge TPU"

    def convert(self, request: ConversionRequest) -> ConversionResult:
        from edge.backends.litert.format import read_tflite

        opts: EdgeTPUOptions = self.read_options(request.options)
        if request.precision != "int8":
            raise PrecisionError(f"the Edge TPU runs full-integer int8 models only, not {request.precision!r}")
        src = Path(request.source)
        info = read_tflite(src)
        _check_full_integer(src)
        out_dir = request.workdir
        model = out_dir / "model.tflite"
        if src.resolve() != model.resolve():
            shutil.copyfile(src, model)
        io = load_sidecar(src)
        if io is not None:
            (out_dir / "model.io.json").write_text(json.dumps(io, indent=2) + "\n", encoding="utf-8")
        files = [model] + ([out_dir / "model.io.json"] if io is not None else [])
        compiler = find_compiler(opts.compiler)
        finish = finish_command(_final_dir(out_dir))
        details: dict[str, Any] = {"input_ops": list(info.builtin_ops), "finish_with": None}
        if compiler is None:
            what = f"{opts.compiler or COMPILER} is not on PATH, so the model was not compiled for the Edge TPU"
            if opts.require_compiler:
                raise MissingDependencyError(f"converter {self.name!r}: {what}", hint=COMPILER_INSTALL)
            details.update(edgetpu_compiled=False, reason=what, finish_with=finish)
            note = (
                f"{what}: the bundle holds the ready full-integer model.tflite, which the Edge TPU runs none of "
                f"until compiled. Finish it on an x86-64 Linux machine that has {COMPILER}: `{finish}` (compiles "
                "model.tflite and writes the re-hashed bundle; or convert there, same result)"
            )
            return ConversionResult(
                artifact=model,
                format="tflite",
                files=files,
                tool_versions={COMPILER: "not installed"},
                details=details,
                notes=[note],
            )

        compiled = compile_model(
            model, out_dir, compiler=compiler, extra_args=opts.extra_args, timeout_s=opts.timeout_s
        )
        details.update(edgetpu_compiled=True, command=compiled.command, **compiled.log)
        return ConversionResult(
            artifact=compiled.model,
            format=self.target_format,
            files=files + compiled.files,
            tool_versions={COMPILER: compiled.version or "unknown"},
            details=details,
            notes=compiled.notes,
        )


def find_compiler(name: str | None = None) -> str | None:
    """The edgetpu_compiler executable to run (``name``: a command or path; default: on PATH), or None."""
    return shutil.which(str(name or COMPILER))


def finish_command(bundle: str) -> str:
    """What finishes an uncompiled Edge TPU bundle on a machine with the compiler."""
    return f"edgekit finish {shlex.quote(bundle)}"


@dataclass(frozen=True)
class CompiledModel:
    """What one edgetpu_compiler run produced and said."""

    model: Path  # <stem>_edgetpu.tflite
    files: list[Path]  # the compiled model, its I/O sidecar (when the int8 model has one), the compiler's log
    command: str
    log: dict[str, Any]  # parse_compiler_log(): compiler_version, tpu_ops, cpu_ops, ops
    notes: list[str]

    @property
    def version(self) -> str | None:
        return self.log["compiler_version"]  # type: ignore[no-any-return]


def compile_model(
    model: Path, out_dir: Path, *, compiler: str, extra_args: Sequence[Any] = (), timeout_s: float = 600.0
) -> CompiledModel:
    """Run ``compiler`` on the full-integer ``model``, writing ``<stem>_edgetpu.tflite`` (+ log) into ``out_dir``.

    The compiled model's I/O sidecar is the int8 model's with ``cpu_model`` naming the int8 model:
    the runner's CPU fallback runs that one (a compiled model needs the Edge TPU)."""
    cmd = [compiler, "-s", "-o", str(out_dir), *(str(a) for a in extra_args), str(model)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ConversionError(f"{COMPILER} did not finish within {timeout_s:.0f} s on {model.name}") from None
    except OSError as e:
        raise ConversionError(
            f"{COMPILER} ({compiler}) could not be started: {e.strerror or e}", hint=COMPILER_INSTALL
        ) from None
    compiled = out_dir / f"{model.stem}_edgetpu.tflite"
    log_file = out_dir / f"{model.stem}_edgetpu.log"
    if proc.returncode != 0 or not compiled.is_file():
        tail = " | ".join(ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip())[-800:]
        raise ConversionError(f"{COMPILER} failed on {model.name} (exit {proc.returncode}): {tail}")
    parsed = parse_compiler_log(proc.stdout)
    if not parsed["ops"] and log_file.is_file():  # the op table is on stdout with -s, else only in the log
        parsed = parse_compiler_log(proc.stdout + "\n" + log_file.read_text(errors="replace"))
    if parsed["compiler_version"] is None:
        v = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
        m = re.search(r"version\s+(\S+)", v.stdout + v.stderr)
        parsed["compiler_version"] = m.group(1) if m else None
    files = [compiled]
    io_src = model.with_suffix(".io.json")
    io = load_sidecar(model) if io_src.is_file() else None  # the same file
    if io is not None:
        io_tpu = compiled.with_suffix(".io.json")
        io_tpu.write_text(json.dumps({**io, "cpu_model": model.name}, indent=2) + "\n", encoding="utf-8")
        files.append(io_tpu)
    if log_file.is_file():
        files.append(log_file)
    notes = []
    if parsed["cpu_ops"]:
        cpu = [f"{r['op']} x{r['count']} ({r['status']})" for r in parsed["ops"] if r["on"] == "cpu"]
        notes.append(f"{parsed['cpu_ops']} op(s) stay on the CPU: " + "; ".join(cpu))
    return CompiledModel(compiled, files, " ".join(cmd), parsed, notes)


# -- finishing a bundle built where the compiler was missing ---------------------------------


@dataclass(frozen=True)
class FinishResult:
    bundle: Any  # edge.bundle.bundle.Bundle: the finished bundle, opened and verified
    source_id: str  # the uncompiled bundle it was made from
    compiled: CompiledModel
    signed: Any  # edge.bundle.signing.SignResult, or None
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle_id": self.bundle.id,
            "bundle_path": str(self.bundle.path),
            "finished_from": self.source_id,
            "primary_artifact": self.bundle.info.primary_artifact,
            "compiler_version": self.compiled.version,
            "tpu_ops": self.compiled.log["tpu_ops"],
            "cpu_ops": self.compiled.log["cpu_ops"],
            "signed": self.signed.to_json() if self.signed is not None else None,
            "notes": self.notes,
        }


def finish_bundle(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    key: str | None = None,
    compiler: str | None = None,
    extra_args: Sequence[Any] | None = None,
    timeout_s: float | None = None,
    force: bool = False,
    targets_dir: Sequence[str | os.PathLike[str]] = (),
    keys_directory: str | os.PathLike[str] | None = None,
) -> FinishResult:
    """Compile the int8 model of an uncompiled Edge TPU bundle (built where ``edgetpu_compiler`` was
    missing) and write the compiled bundle at ``output`` (default: in place of ``path``).

    The bundle is verified first; the new one is built in a staging directory beside ``output`` and
    renamed into place, so a failure leaves whatever was there untouched. Its primary artifact is the
    compiled model; every artifact is hashed again and the bundle id follows (``edge.bundle.bundle.bundle_id``);
    the chain gets a ``tflite->edgetpu`` step saying what the compiler did. A benchmark recorded for the
    uncompiled model is dropped. ``key`` (else ``$EDGEKIT_SIGN_KEY``) signs it; without one the old
    signature, which covered the old manifest, is gone and a note says so. Compiler arguments and
    timeout default to the target profile's ``[convert.options."tflite->edgetpu"]``."""
    from edge.bundle.bundle import MANIFEST, Bundle, sign_bundle, staging_dir
    from edge.bundle.signing import SIGNATURE_FILE, configured_sign_key, load_signing_key

    src = Bundle.open(path, verify=False, trust=False)
    notes: list[str] = []
    _verify_source(src, notes)
    _check_finishable(src)
    exe = find_compiler(compiler)
    if exe is None:
        raise MissingDependencyError(
            f"cannot finish {src.id}: {compiler or COMPILER} is not on PATH", hint=COMPILER_INSTALL
        )
    sign_key = configured_sign_key(key)
    if sign_key is not None:
        load_signing_key(sign_key, keys_directory)  # a bad key fails before anything is compiled or written
    options = _profile_options(src, targets_dir, notes)
    dest = Path(output) if output is not None else src.path
    in_place = dest.exists() and dest.resolve() == src.path.resolve()
    if dest.exists() and not in_place and not force:
        raise BundleError(f"{dest} already exists", hint="pass --force to replace it, or choose another --output")
    had_signature = (src.path / SIGNATURE_FILE).is_file()
    signed = None
    with staging_dir(dest, force=True) as stage:
        _copy_verified(src, stage)
        int8 = stage / src.info.primary_artifact
        compiled = compile_model(
            int8,
            int8.parent,
            compiler=exe,
            extra_args=options.extra_args if extra_args is None else extra_args,
            timeout_s=options.timeout_s if timeout_s is None else timeout_s,
        )
        manifest = _finished_manifest(src, stage, dest, compiled, notes)
        Bundle(stage, manifest)  # validated before it is written
        write_json_atomic(stage / MANIFEST, manifest)
        Bundle.open(stage, trust=False)  # exactly its files, every hash
        if sign_key is not None:
            signed = sign_bundle(stage, sign_key, directory=keys_directory)
    notes.append(_signing_note(signed, had_signature, dest))
    return FinishResult(Bundle.open(dest, trust=False), src.id, compiled, signed, notes)


def _verify_source(src: Any, notes: list[str]) -> None:
    """Verify the bundle to finish; the outputs of a manual compiler run, left unlisted in it, are let through
    (they are compiled again) with a note, any other failure is raised."""
    leftovers = _compiler_leftovers(src)
    try:
        src.verify()
    except BundleError:
        if not leftovers:
            raise
        # a manual edgetpu_compiler run left its outputs unlisted: rebuilt here; the listed files are checked below
        notes.append(
            f"ignored {', '.join(leftovers)} in {src.path} (left unhashed by a manual {COMPILER} run; compiled again here)"
        )


def _signing_note(signed: Any, had_signature: bool, dest: Path) -> str:
    """The note on the finished bundle's signature: who signed it, or why it is unsigned and how to sign it."""
    if signed is not None:
        return f"signed with key {signed.key_id}: {signed.name} version {signed.version}"
    what = (
        "the source bundle's signature covered its old manifest and was dropped"
        if had_signature
        else "the source bundle was not signed"
    )
    return f"not signed: {what}; sign it with `edgekit sign {shlex.quote(str(dest))} --key NAME` (or finish with --key)"


def _compiler_leftovers(bundle: Any) -> list[str]:
    """Unlisted ``<stem>_edgetpu.tflite``/``.log`` beside the primary artifact: what running the compiler by hand leaves."""
    listed = {a.path for a in bundle.info.artifacts}
    primary = Path(bundle.info.primary_artifact)
    names = [(primary.parent / f"{primary.stem}_edgetpu{ext}").as_posix() for ext in (".tflite", ".log")]
    return [n for n in names if n not in listed and (bundle.path / n).is_file()]


def _check_finishable(bundle: Any) -> None:
    from edge.backends.litert.format import read_tflite

    info = bundle.info
    delegate = info.runner.options_dict.get("delegate")
    if not any(c.converter == TFLiteToEdgeTPU.name for c in info.chain) or delegate != "edgetpu":
        raise BundleError(
            f"{bundle.id} is not an Edge TPU bundle (target {info.target.name}, runner {info.runner.name}"
            f"{f' delegate {delegate}' if delegate else ''}, no {TFLiteToEdgeTPU.name} step): "
            "`edgekit finish` compiles coral-edgetpu bundles only"
        )
    if info.format == TFLiteToEdgeTPU.target_format or read_tflite(bundle.artifact).edgetpu_compiled:
        raise BundleError(
            f"{bundle.id} is already compiled for the Edge TPU ({info.primary_artifact} holds {EDGETPU_OP}): nothing to finish"
        )


def _profile_options(bundle: Any, targets_dir: Sequence[str | os.PathLike[str]], notes: list[str]) -> EdgeTPUOptions:
    """The target profile's options for the compiler step, as ``convert`` would have used them (typed, checked)."""
    from edge.targets import get_target

    try:
        profile = get_target(bundle.target, targets_dir)
    except TargetError:
        notes.append(f"target profile {bundle.target!r} not found here: compiled with {COMPILER}'s default arguments")
        return EdgeTPUOptions()
    typed: EdgeTPUOptions = TFLiteToEdgeTPU.read_options(profile.convert_options.get(TFLiteToEdgeTPU.name, {}))
    return typed


def _copy_verified(bundle: Any, stage: Path) -> None:
    """Copy the listed artifacts into ``stage``, each checked against its recorded size and sha256 (all problems at once)."""

    problems = []
    for a in bundle.info.artifacts:
        dst = stage / a.path
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle.path / a.path, dst)
        if dst.stat().st_size != a.bytes or sha256_file(dst) != a.sha256:
            problems.append(f"{a.path}: sha256 differs from the manifest")
    if problems:
        raise BundleError(
            f"bundle {bundle.path} failed verification: " + "; ".join(problems),
            hint="rebuild it with `edgekit convert`",
        )


def _finished_manifest(src: Any, stage: Path, dest: Path, compiled: CompiledModel, notes: list[str]) -> dict[str, Any]:
    import copy
    from datetime import datetime, timezone

    import edge
    from edge.bundle.bundle import artifact_entries, bundle_id
    from edge.bundle.fields import fit_notes
    from edge.capabilities import current_host

    info = src.info
    m: dict[str, Any] = copy.deepcopy(src.manifest)
    artifacts = artifact_entries(stage, [f for f in stage.rglob("*") if f.is_file()])
    stem = Path(info.source.file).stem if info.source is not None else info.bundle_id.split("-")[0]
    log = compiled.log
    step_notes = [
        f"compiled by `edgekit finish` from bundle {src.id}: {log['tpu_ops']} op(s) on the Edge TPU, {log['cpu_ops']} on the CPU"
    ] + compiled.notes
    m.update(
        {
            "edgekit_version": edge.__version__,
            "bundle_id": bundle_id(
                stem, info.target.name, info.precision, [a["sha256"] for a in artifacts], info.runner.options_dict
            ),
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "format": TFLiteToEdgeTPU.target_format,
            "primary_artifact": compiled.model.relative_to(stage).as_posix(),
            "artifacts": artifacts,
            "chain": [
                *m.get("chain", []),
                {
                    "converter": TFLiteToEdgeTPU.name,
                    "precision": info.precision,
                    "output_format": TFLiteToEdgeTPU.target_format,
                    "tool_versions": {COMPILER: compiled.version or "unknown"},
                    "details": {
                        "edgetpu_compiled": True,
                        "finished_from": src.id,
                        "finished_on": current_host().describe(),
                        "command": compiled.command.replace(str(stage), str(dest)),
                        **log,
                    },
                    "notes": fit_notes(step_notes),
                },
            ],
        }
    )
    m.pop("version", None)  # a signed version belongs to a signature; signing gives the new manifest its own
    if m.get("benchmark") is not None:
        m["benchmark"] = None
        notes.append(
            "dropped the benchmark recorded for the uncompiled model; benchmark the compiled one on the "
            "device (`edgekit bench BUNDLE --record`)"
        )
    return m


def _final_dir(workdir: Path) -> str:
    """The bundle directory the work directory becomes (``convert`` stages ``.NAME.partial-XXXX`` beside it)."""
    m = re.fullmatch(r"\.(.+)\.partial-[^/]*", workdir.name)
    return str(workdir.parent / m.group(1)) if m else "BUNDLE"


def _check_full_integer(path: Path) -> None:
    """The Edge TPU needs every compute op in int8/uint8; list every float op at once."""
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        return
    it = Interpreter(
        model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    import numpy as np

    float_ops = sorted(
        {
            o["op_name"]
            for o in it._get_ops_details()
            if o["op_name"] not in ("QUANTIZE", "DEQUANTIZE")
            and any(t in (np.float32, np.float16) for t in o.get("result_types", []))
        }
    )
    if float_ops:
        raise ConversionError(
            f"{path.name} is not a full-integer model (float ops: {', '.join(float_ops)}); "
            "the Edge TPU compiles only full-integer int8 models",
            hint="convert with precision int8 and calibration data",
        )

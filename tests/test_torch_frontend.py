"""The PyTorch path, compared with torch itself."""

import pytest
import torch
from helpers import check_against_torch

import aotc
from aotc.examples import models


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):
        x = torch.nn.functional.relu6(self.bn(self.conv(x)))
        return torch.softmax(self.fc(x.mean(dim=(2, 3))), dim=-1)


def test_module_matches_torch(tmp_path):
    torch.manual_seed(0)
    check_against_torch(SmallNet(), (torch.randn(2, 3, 16, 16),), tmp_path)


def test_saved_pt2_matches_torch(tmp_path):
    torch.manual_seed(0)
    net, x = SmallNet().eval(), torch.randn(2, 3, 16, 16)
    torch.export.save(torch.export.export(net, (x,)), tmp_path / "net.pt2")
    aotc.compile(tmp_path / "net.pt2", output=tmp_path / "net.so")
    got = aotc.load(tmp_path / "net.so")(x.numpy())
    with torch.no_grad():
        want = net(x).numpy()
    import numpy as np
    np.testing.assert_allclose(list(got.values())[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_resnet18_module_matches_torch(tmp_path):
    model, inputs = models.build("resnet18")
    check_against_torch(model, inputs, tmp_path, rtol=1e-4, atol=1e-4)


class ConvGRU(torch.nn.Module):
    """conv1d features, a GRU, the last step classified: x[:, -1] read out of bounds before
    GuardIndices (outputs of 1e25 or NaN)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 16, 3, padding=1)
        self.gru = torch.nn.GRU(16, 32, batch_first=True)
        self.fc = torch.nn.Linear(32, 5)

    def forward(self, x):
        out, _ = self.gru(torch.relu(self.conv(x)).transpose(1, 2))
        return self.fc(out[:, -1])


class LSTMTagger(torch.nn.Module):
    """Embedding -> bidirectional LSTM -> per-token classes."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.lstm = torch.nn.LSTM(16, 24, batch_first=True, bidirectional=True)
        self.fc = torch.nn.Linear(48, 7)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.fc(out)


def test_conv_gru_classifier_matches_torch(tmp_path):
    torch.manual_seed(0)
    check_against_torch(ConvGRU(), (torch.randn(2, 8, 20),), tmp_path, atol=1e-5)


def test_bidirectional_lstm_tagger_matches_torch(tmp_path):
    torch.manual_seed(0)
    check_against_torch(LSTMTagger(), (torch.randint(0, 50, (2, 12)),), tmp_path, atol=1e-5)


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x) + torch.special.i1e(x)


def test_unsupported_ops_are_listed_up_front(tmp_path):
    from aotc.errors import UnsupportedModelError
    with pytest.raises(UnsupportedModelError, match=r"2 unsupported PyTorch op\(s\).*bessel_j0.*"
                                                    r"special_i1e"):
        aotc.compile(Unsupported(), example_inputs=(torch.randn(3),), output=tmp_path / "u.so")


def test_a_module_in_training_is_compiled_for_inference_and_keeps_its_modes(tmp_path):
    """Compiled as in eval mode (batch norm from its running statistics), and handed back in
    the modes it came in: a model compiled mid-training goes on training."""
    torch.manual_seed(0)
    net = SmallNet()
    net.bn.running_mean.uniform_(-1, 1)
    net.bn.running_var.uniform_(0.5, 2)
    net.train()
    net.fc.eval()  # a mixed state is kept as it is too
    modes = {name: m.training for name, m in net.named_modules()}
    x = torch.randn(2, 3, 16, 16)
    aotc.compile(net, example_inputs=(x,), output=tmp_path / "m.so")
    assert {name: m.training for name, m in net.named_modules()} == modes
    with torch.no_grad():
        want = net.eval()(x).numpy()
    got = aotc.load(tmp_path / "m.so")(x=x.numpy())
    assert abs(next(iter(got.values())) - want).max() < 1e-5


def test_torch_models_compile_after_the_compiler_loaded_without_torch(tmp_path):
    """``aotc compile`` imports TVM with torch hidden from tvm_ffi (an ONNX compile never
    needs it); a torch module and a .pt2 compiled later in that process still match torch."""
    import subprocess
    import sys
    code = f"""
import sys
import aotc.compiler
assert "torch" not in sys.modules, "the compiler imported torch"
import numpy as np, torch
sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
from test_torch_frontend import SmallNet
import aotc
torch.manual_seed(0)
net, x = SmallNet().eval(), torch.randn(2, 3, 16, 16)
aotc.compile(net, output={str(tmp_path / "module.so")!r}, example_inputs=(x,))
torch.export.save(torch.export.export(net, (x,)), {str(tmp_path / "net.pt2")!r})
aotc.compile({str(tmp_path / "net.pt2")!r}, output={str(tmp_path / "pt2.so")!r})
np.save({str(tmp_path / "x.npy")!r}, x.numpy())
with torch.no_grad():
    np.save({str(tmp_path / "want.npy")!r}, net(x).numpy())
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    import numpy as np
    x, want = np.load(tmp_path / "x.npy"), np.load(tmp_path / "want.npy")
    for name in ("module.so", "pt2.so"):
        got = aotc.load(tmp_path / name)(x)
        np.testing.assert_allclose(list(got.values())[0], want, rtol=1e-4, atol=1e-5)

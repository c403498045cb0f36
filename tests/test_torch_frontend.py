"""The PyTorch path, compared with torch itself."""

import pytest
import torch

import aotc
from aotc.examples import models
from helpers import check_against_torch


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

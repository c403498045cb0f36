"""Models exported from torch as a user would, that failed before in ways the node suite does
not show: shape arithmetic reaching TVM's importer unfolded ("Reshape requires the input new
shape to be Shape") and ConvTranspose dying at codegen after the NHWC conversion."""

import warnings

import numpy as np
import torch
from helpers import compile_and_load


class SegmentationHead(torch.nn.Module):
    """Strided encoder, learned 2x upsampling (ConvTranspose), per-pixel classes."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.up = torch.nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.cls = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.cls(torch.relu(self.up(torch.relu(self.enc(x)))))


class ShapeComputingReshape(torch.nn.Module):
    """Reads its batch size and channels from x.shape: Shape -> Gather -> Concat -> Reshape."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 5)

    def forward(self, x):
        batch = x.shape[0]
        tokens = x.reshape(batch, x.shape[1], -1).transpose(1, 2)
        return self.fc(tokens).reshape(batch, -1)


def _export_and_compare(module, x, tmp_path, dynamic_axes=None):
    path = tmp_path / f"{type(module).__name__}.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (x,), str(path), input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False, dynamic_axes=dynamic_axes)
    model = compile_and_load(path, tmp_path, input_shapes={"x": tuple(x.shape)})
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(model(x.numpy())["y"], want, rtol=1e-4, atol=1e-5)


def test_segmentation_head_with_learned_upsampling(tmp_path):
    torch.manual_seed(0)
    _export_and_compare(SegmentationHead(), torch.randn(1, 3, 32, 32), tmp_path)


def test_shape_computing_reshape_with_a_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    _export_and_compare(ShapeComputingReshape(), torch.randn(2, 12, 4, 4), tmp_path,
                        dynamic_axes={"x": {0: "batch"}})

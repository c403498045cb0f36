"""INT8 accuracy on trained weights: a small CNN trained here on scikit-learn's digits (8x8
images, 10 classes), quantized with each calibration method from 200 training images, and
evaluated on the 360 held-out test images. int8 accuracy must stay within 1 point of float32,
and the report must say what it measured."""

import numpy as np
import pytest
import torch

import aotc

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = pytest.mark.xdist_group("test_digits_accuracy")

datasets = pytest.importorskip("sklearn.datasets")


class DigitsNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


@pytest.fixture(scope="module")
def trained():
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target
    train_x, test_x = torch.from_numpy(images[:1437]), images[1437:]
    train_y, test_y = torch.from_numpy(labels[:1437]), labels[1437:]
    torch.manual_seed(0)
    net = DigitsNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(25):
        for start in range(0, 1437, 64):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(train_x[start:start + 64]),
                                                     train_y[start:start + 64])
            loss.backward()
            optimizer.step()
    return net.eval(), images[:200], test_x, test_y


def _accuracy(model, images, labels):
    predictions = [int(np.argmax(model(x[None])["output0"])) for x in images]
    return float(np.mean(np.array(predictions) == labels))


@pytest.fixture(scope="module")
def float_accuracy(trained, tmp_path_factory):
    net, _, test_x, test_y = trained
    out = tmp_path_factory.mktemp("fp32") / "digits.so"
    aotc.compile(net, "x86", out, example_inputs=(torch.from_numpy(test_x[:1]),))
    return _accuracy(aotc.load(out), test_x, test_y)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_int8_within_one_point(trained, float_accuracy, tmp_path, method):
    net, calibration, test_x, test_y = trained
    settings = aotc.QuantizeOptions(calibration, method=method,
                                    evaluation=[x[None] for x in test_x])
    meta = aotc.compile(net, "x86", tmp_path / "digits8.so", quantize=settings,
                        example_inputs=(torch.from_numpy(test_x[:1]),))
    int8 = _accuracy(aotc.load(tmp_path / "digits8.so"), test_x, test_y)
    assert float_accuracy > 0.9
    assert int8 >= float_accuracy - 0.01, (method, int8, float_accuracy)
    report = meta["quantization_report"]
    assert report["int8_layers"] == 3 and report["evaluated_on"] == "held-out samples"
    assert report["samples"] == 360 and report["outputs"][0]["top1_agreement"] > 0.97
    assert (tmp_path / "digits8.so.quant.json").is_file()
    assert meta["quantization"]["layers"] == ["conv2d_0", "conv2d_1", "matmul_0"]

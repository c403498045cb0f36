"""Narrow convs that no int8 layer follows stay float32 (compiler/quantize/narrow_islands.py).

A 3-channel stem feeding a depthwise conv (no int8 kernel: MobileNetV2's shape) is left
float32; the same stem feeding an int8 conv through relu and max pool (ResNet-18's shape)
stays int8, as does a wide conv with nothing int8 after it. Through the compile: the report
names the float32 stem and why, and the int8 model still matches float32."""

import numpy as np
from helpers import assert_near_torch
from tvm import relax

import aotc
from aotc.compiler.quantize import main_sites
from aotc.compiler.quantize.driver import chosen_sites
from aotc.compiler.quantize.narrow_islands import narrow_islands
from aotc.options import QuantizeOptions

RNG = np.random.default_rng(0)


def _conv(x, ic, oc, groups=1):
    weight = relax.const((RNG.standard_normal((3, 3, ic // groups, oc)) * 0.3)
                         .astype(np.float32))
    return relax.op.nn.conv2d(x, weight, padding=[1, 1], groups=groups, data_layout="NHWC",
                              kernel_layout="HWIO")


def _module(after_stem: str, stem_channels: int = 3):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 16, stem_channels), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.clip(_conv(x, stem_channels, 16), 0.0, 6.0))
            if after_stem == "depthwise":
                out = bb.emit_output(_conv(y, 16, 16, groups=16))
            else:  # relu, max pool, then an int8 conv
                pooled = bb.emit(relax.op.nn.max_pool2d(relax.op.nn.relu(y), [2, 2], [2, 2],
                                                        layout="NHWC"))
                out = bb.emit_output(_conv(pooled, 16, 16))
        bb.emit_func_output(out)
    return bb.get()


def test_a_narrow_stem_before_a_depthwise_conv_stays_float32():
    mod = _module("depthwise")
    sites = main_sites(mod)
    assert [s.name for s in sites] == ["conv2d_0"]  # the depthwise conv is no site
    assert list(narrow_islands(mod["main"], sites)) == ["conv2d_0"]
    assert "3 input channels" in narrow_islands(mod["main"], sites)["conv2d_0"]


def test_a_narrow_stem_that_feeds_int8_convs_stays_int8():
    mod = _module("int8 conv")
    sites = main_sites(mod)
    assert [s.name for s in sites] == ["conv2d_0", "conv2d_1"]
    assert narrow_islands(mod["main"], sites) == {}


def test_a_wide_conv_without_int8_after_it_stays_int8():
    mod = _module("depthwise", stem_channels=8)
    assert narrow_islands(mod["main"], main_sites(mod)) == {}


def test_chosen_sites_keeps_a_users_skip_reason_first():
    mod = _module("depthwise")
    settings = QuantizeOptions([{"x": np.zeros((1, 16, 16, 3), np.float32)}],
                               skip_layers=("conv2d_0",))
    chosen, skipped = chosen_sites(main_sites(mod), settings, mod["main"])
    assert chosen == [] and skipped == {"conv2d_0": "--skip-layers"}


def test_compile_reports_the_float32_stem_and_still_matches(tmp_path):
    """A stem, a depthwise conv, then a 1x1 conv: the stem is float32, the 1x1 int8."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.project = torch.nn.Conv2d(16, 24, 1)

        def forward(self, x):
            y = torch.nn.functional.relu6(self.stem(x))
            return self.project(torch.nn.functional.relu6(self.dw(y)))

    torch.manual_seed(0)
    net = Net().eval()
    calib = [RNG.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(8)]
    meta = aotc.compile(net, output=tmp_path / "m.so",
                        example_inputs=(torch.from_numpy(calib[0]),),
                        quantize=QuantizeOptions(calib, method="minmax"))
    report = meta["quantization_report"]
    assert list(report["float32_layers"]) == ["conv2d_0"]
    assert report["int8_layers"] == 1
    assert_near_torch(net, tmp_path / "m.so",
                      RNG.standard_normal((1, 3, 32, 32)).astype(np.float32), 0.03)

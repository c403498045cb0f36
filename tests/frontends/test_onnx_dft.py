"""DFT as constant-matrix products (onnx_dft.py; TVM has no converter): forward, inverse,
onesided (rfft), onesided inverse (irfft) and dft_length, against numpy's float64 FFT."""

import numpy as np
import onnx
import pytest
from helpers import compile_and_load
from onnx import TensorProto, helper

RNG = np.random.default_rng(0)


def _dft_model(shape, out_shape, length=None, **attrs):
    inputs = ["x", "n" if length else "", "axis"]
    init = [onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")]
    if length:
        init.append(onnx.numpy_helper.from_array(np.array(length, np.int64), "n"))
    graph = helper.make_graph(
        [helper.make_node("DFT", inputs, ["y"], **attrs)], "dft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _as_complex(y):
    return y[..., 0] + 1j * y[..., 1]


@pytest.mark.parametrize("kind", ["forward", "inverse", "rfft", "irfft", "padded"])
def test_dft_matches_numpy(tmp_path, kind):
    real = RNG.standard_normal((2, 8, 3, 1)).astype(np.float32)
    spectrum = RNG.standard_normal((2, 5, 3, 2)).astype(np.float32)
    if kind == "forward":
        model, x = _dft_model([2, 8, 3, 1], [2, 8, 3, 2]), real
        want = np.fft.fft(real[..., 0].astype(np.float64), axis=1)
    elif kind == "inverse":
        full = RNG.standard_normal((2, 8, 3, 2)).astype(np.float32)
        model, x = _dft_model([2, 8, 3, 2], [2, 8, 3, 2], inverse=1), full
        want = np.fft.ifft(_as_complex(full.astype(np.float64)), axis=1)
    elif kind == "rfft":
        model, x = _dft_model([2, 8, 3, 1], [2, 5, 3, 2], onesided=1), real
        want = np.fft.rfft(real[..., 0].astype(np.float64), axis=1)
    elif kind == "irfft":
        model, x = _dft_model([2, 5, 3, 2], [2, 8, 3, 1], inverse=1, onesided=1), spectrum
        want = np.fft.irfft(_as_complex(spectrum.astype(np.float64)), n=8, axis=1)
    else:  # dft_length 12 zero-pads the 8 samples
        model, x = _dft_model([2, 8, 3, 1], [2, 12, 3, 2], length=12), real
        want = np.fft.fft(real[..., 0].astype(np.float64), n=12, axis=1)
    got = compile_and_load(model, tmp_path).run({"x": x})["y"]
    got = got[..., 0] if kind == "irfft" else _as_complex(got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

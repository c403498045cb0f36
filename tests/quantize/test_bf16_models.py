"""aotc compile --precision bf16 end to end, through the CLI, on an ONNX model of two 3x3
convs and two matmuls (512x2048 and a 2048x10 classifier): every one of them becomes a bf16
kernel, and the compile reports its accuracy against the float32 build. Checked against
onnxruntime's float32 output; and the refusals a user gets on targets
without AVX512-BF16 or AVX512-FP16."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from relax_helpers import assert_matches

import aotc
from aotc.cli import main
from aotc.targets import x86

RNG = np.random.default_rng(0)
needs_bf16 = pytest.mark.skipif(not x86._BF16_FLAGS <= x86.cpu_flags(),
                                reason="this CPU has no AVX512-BF16 to run the model on")


def _init(name, *shape, scale=1.0):
    return numpy_helper.from_array(
        (RNG.standard_normal(shape) * scale / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
        name)


def _model(path):
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Concat", ["f", "f"], ["f2"], axis=1),
             helper.make_node("MatMul", ["f2", "w2"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("MatMul", ["hr", "w3"], ["y"])]
    inits = [_init("w0", 256, 8, 3, 3, scale=2), _init("w1", 256, 256, 3, 3, scale=2),
             _init("b1", 256), _init("w2", 512, 2048, scale=8), _init("w3", 2048, 10, scale=4)]
    graph = helper.make_graph(nodes, "bf16_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@needs_bf16
def test_compile_bf16_cli_against_onnxruntime(tmp_path):
    model = _model(tmp_path / "net.onnx")
    out = tmp_path / "net_bf16.so"
    result = invoke("compile", model, "-o", out, "--precision", "bf16")
    assert result.exit_code == 0, result.output
    loaded = aotc.load(out)
    assert loaded.metadata["precision"] == "bf16"
    kernels = " ".join(k["name"] for k in loaded.metadata["kernels"])
    assert kernels.count("matmul_bf16") == 2 and kernels.count("conv2d_bf16") == 2, kernels
    assert "packed" not in kernels, kernels
    # the accuracy report: this model against its float32 build, on random inputs
    assert "bf16 accuracy against float32 on 4 random inputs" in result.output
    report = json.loads((tmp_path / "net_bf16.so.precision.json").read_text())
    [row] = report["outputs"]
    assert row["output"] == "y" and row["cosine"] > 0.999 and row["top1_agreement"] == 1.0
    x = RNG.standard_normal((1, 8, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    assert_matches(loaded.run({"x": x})["y"], want, 0.999, 0.02)


def _stem_and_block_model(path):
    """An image model's stem (7x7 stride-2 conv, relu, 3x3 stride-2 max pool padded by 1) and a
    bottleneck block whose shortcut is a 1x1 conv, on an odd 33x33 image; then a classifier."""
    def conv(x, w, b, out, **attrs):
        return helper.make_node("Conv", [x, w, b], [out], **attrs)
    nodes = [conv("x", "w0", "b0", "c0", strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             conv("p0", "w1", "b1", "c1"), helper.make_node("Relu", ["c1"], ["r1"]),
             conv("r1", "w2", "b2", "c2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             conv("r2", "w3", "b3", "c3"), conv("p0", "w4", "b4", "s"),
             helper.make_node("Add", ["c3", "s"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "w5"], ["y"])]
    inits = [_init("w0", 16, 3, 7, 7, scale=2), _init("b0", 16),
             _init("w1", 8, 16, 1, 1, scale=2), _init("b1", 8),
             _init("w2", 8, 8, 3, 3, scale=2), _init("b2", 8),
             _init("w3", 32, 8, 1, 1, scale=2), _init("b3", 32),
             _init("w4", 32, 16, 1, 1, scale=2), _init("b4", 32), _init("w5", 32, 10, scale=4)]
    graph = helper.make_graph(
        nodes, "stem_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 33, 33])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_bf16
def test_bf16_activations_stay_bf16_through_the_pool_and_the_shortcut(tmp_path):
    """MaxPoolBF16: the stem's kernel writes bfloat16 bits and the pool reads them;
    ResidualFromBF16: the shortcut conv writes bits and the add widens them. Checked against
    onnxruntime's float32 output."""
    model = _stem_and_block_model(tmp_path / "stem.onnx")
    out = tmp_path / "stem_bf16.so"
    result = invoke("compile", model, "-o", out, "--precision", "bf16")
    assert result.exit_code == 0, result.output
    loaded = aotc.load(out)
    kernels = {k["name"]: [a.get("dtype") for a in k["args"]] for k in loaded.metadata["kernels"]}
    [pool] = [name for name in kernels if "max_pool2d_bf16" in name]
    assert kernels[pool][0] == "uint16", kernels  # reads the stem's bits
    [stem] = [name for name in kernels if name.startswith("fused_conv2d_bf16_")]
    assert kernels[stem][-1] == "uint16", kernels  # writes them
    assert any("add_bf16" in name for name in kernels), kernels
    x = RNG.standard_normal((1, 3, 33, 33)).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    assert_matches(loaded.run({"x": x})["y"], want, 0.999, 0.02)


def _winograd_model(path):
    """3x3 convs with each Winograd form: 28x28 (F(4x4)), a stride-2 one (none), 14x14
    (F(2x2)); then a classifier."""
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["s2"]),
             helper.make_node("Relu", ["s2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "w3"], ["y"])]
    inits = [_init("w0", 32, 16, 3, 3, scale=2), _init("b0", 32),
             _init("w1", 64, 32, 3, 3, scale=2), _init("w2", 64, 64, 3, 3, scale=2),
             _init("b2", 64), _init("w3", 64, 10, scale=4)]
    graph = helper.make_graph(
        nodes, "bf16_winograd_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_bf16
def test_bf16_3x3_convs_take_their_winograd_forms(tmp_path):
    """--precision bf16 for an AVX512-BF16 target without AMX (x86-bf16): the F(4x4) conv runs
    as float32 Winograd kernels, the F(2x2) one as bf16 Winograd kernels, the strided one as
    a direct bf16 kernel; with WinogradConv disabled all three are direct. On AMX (the host
    where it has AMX) all three are direct AMX convs. All against onnxruntime."""
    model = _winograd_model(tmp_path / "net.onnx")
    x = np.maximum(RNG.standard_normal((1, 16, 28, 28)), 0).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    cases = [("x86-bf16", (), {"winograd_matmul_bf16": 1, "winograd_matmul ": 1,
                               "conv2d_bf16": 1}),
             ("x86-bf16", ("WinogradConv",), {"winograd": 0, "conv2d_bf16": 3})]
    if {"amx_tile", "amx_bf16"} <= x86.cpu_flags():
        cases.append(("x86", (), {"winograd": 0, "conv2d_bf16": 3}))
    for index, (target, disabled, expected) in enumerate(cases):
        out = tmp_path / f"net_{index}.so"
        aotc.compile(model, output=out, target=target, precision="bf16",
                     options=aotc.CompileOptions(disabled_passes=disabled))
        loaded = aotc.load(out)
        kernels = " ".join(k["name"] for k in loaded.metadata["kernels"]) + " "
        assert {word: kernels.count(word) for word in expected} == expected, kernels
        assert_matches(loaded.run({"x": x})["y"], want, 0.999, 0.02)


@pytest.mark.parametrize("target,precision,words", [
    ("x86-vnni", "bf16", "needs AVX512-BF16 (vdpbf16ps), which x86-vnni"),
    ("arm", "bf16", "not built for arm"),
    ("x86-vnni", "fp16", "needs AVX512-FP16 (vfmadd231ph), which x86-vnni")])
def test_refused_before_the_import(tmp_path, target, precision, words):
    result = invoke("compile", tmp_path / "missing.onnx", "-o", tmp_path / "m.so",
                    "--target", target, "--precision", precision)
    assert result.exit_code == 1 and words in result.output, result.output


def _attention_model(path, tokens=77, hidden=128, heads=2):
    """One self-attention block as exporters write it: Q, K and V projections, head split,
    softmax(Q @ Kt / 8 + mask) @ V, heads merged, output projection. 77 tokens: rows and keys
    both padded in the kernel."""
    head = hidden // heads
    split = numpy_helper.from_array(np.array([1, tokens, heads, head], np.int64), "split")
    merge = numpy_helper.from_array(np.array([1, tokens, hidden], np.int64), "merge")
    scale = numpy_helper.from_array(np.array(8.0, np.float32), "scale")
    nodes = []
    for name in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}0"]),
                  helper.make_node("Reshape", [f"{name}0", "split"], [f"{name}1"])]
    nodes += [helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]),
              helper.make_node("Div", ["s", "scale"], ["s1"]),
              helper.make_node("Add", ["s1", "mask"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merge"], ["o2"]),
              helper.make_node("MatMul", ["o2", "wo"], ["y"])]
    inits = [_init(f"w{name}", hidden, hidden) for name in "qkvo"]  # scores near N(0, 1)
    graph = helper.make_graph(
        nodes, "bf16_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, hidden]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, tokens])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, hidden])],
        inits + [split, merge, scale])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_bf16
def test_bf16_attention_kernel_against_onnxruntime(tmp_path):
    """--precision bf16 runs attention as the bf16 kernel, its operands packed in the
    head-split kernels; with AttentionBF16 disabled it stays the float32 attention kernel.
    Both against onnxruntime."""
    model = _attention_model(tmp_path / "attention.onnx")
    x = RNG.standard_normal((1, 77, 128)).astype(np.float32)
    mask = np.where(RNG.random((1, 1, 1, 77)) < 0.2, -1e4, 0).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x, "mask": mask})[0]
    for disabled in ((), ("AttentionBF16",)):
        out = tmp_path / f"attention_{len(disabled)}.so"
        aotc.compile(model, output=out, precision="bf16",
                     options=aotc.CompileOptions(disabled_passes=disabled))
        loaded = aotc.load(out)
        kernels = " ".join(k["name"] for k in loaded.metadata["kernels"])
        if disabled:
            assert "attention_bf16" not in kernels and "softmax" in kernels, kernels
        else:
            assert "attention_bf16" in kernels and "softmax" not in kernels, kernels
            assert "pack_keys_bf16" in kernels and "pack_values_bf16" in kernels, kernels
        assert_matches(loaded.run({"x": x, "mask": mask})["y"], want, 0.999, 0.02)


@needs_bf16
def test_bf16_convs_over_a_prime_width_against_onnxruntime(tmp_path):
    """Strided Conv1d layers over 95 and then 47 steps (as wav2vec2's feature extractor runs
    over 799 and 199), then a matmul of the 47 frames: every conv and matmul a bf16 kernel
    (on AMX the convs compute 48 columns and crop one, the matmul pads its rows to 64); the
    compiled model, loaded in a fresh process, against onnxruntime."""
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], strides=[2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Transpose", ["r1"], ["t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t", "w2"], ["y"])]
    inits = [_init("w0", 64, 32, 3, scale=2), _init("b0", 64), _init("w1", 64, 64, 3, scale=2),
             _init("b1", 64), _init("w2", 64, 48, scale=2)]
    graph = helper.make_graph(
        nodes, "conv1d_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 95])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 47, 48])], inits)
    model = tmp_path / "conv1d.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    out = tmp_path / "conv1d_bf16.so"
    result = invoke("compile", model, "-o", out, "--precision", "bf16")
    assert result.exit_code == 0, result.output
    loaded = aotc.load(out)
    kernels = " ".join(k["name"] for k in loaded.metadata["kernels"])
    assert kernels.count("conv2d_bf16") == 2 and "matmul_bf16" in kernels, kernels
    x = RNG.standard_normal((1, 32, 95)).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    assert_matches(loaded.run({"x": x})["y"], want, 0.999, 0.02)

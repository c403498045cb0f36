"""Models exported with dynamic axes compile once and run at any batch and length: a BERT and
a GPT-2 built by transformers from small configs (random weights), exported by torch's ONNX
exporter with ``dynamic_axes``. Before, the BERT was refused at its attention-mask Expand and
the GPT-2 died in TVM's importer. Also --input-range, --bind and the dim-range check."""

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_builders import if_on_an_input

import aotc
from aotc.errors import AotcError, InputMismatchError, UnsupportedModelError
from aotc.examples.dynamic_transformers import export, feed

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = pytest.mark.xdist_group("test_variable_length")

pytest.importorskip("transformers")

LENGTHS = [(1, 1), (1, 16), (4, 16), (2, 128), (1, 384), (3, 37)]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    path = export("bert", folder / "bert.onnx", hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=128, vocab_size=1000)
    meta = aotc.compile(path, output=folder / "bert.so")
    return path, folder / "bert.so", meta


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    path = export("gpt2", folder / "gpt2.onnx", n_embd=64, n_layer=2, n_head=4,
                  vocab_size=1000)
    meta = aotc.compile(path, output=folder / "gpt2.so")
    return path, folder / "gpt2.so", meta


def _feed(names, batch, length, seed=0):
    return feed(names, batch, length, vocab=1000, seed=seed)


@pytest.mark.parametrize("fixture", ["bert", "gpt2"])
def test_one_library_runs_every_batch_and_length(request, fixture):
    onnx_path, so, meta = request.getfixturevalue(fixture)
    assert meta["signature"]["inputs"][0]["shape"] == ["batch", "seq"]
    model = aotc.load(so)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for batch, length in LENGTHS:
        inputs = _feed(model.signature.input_names(), batch, length)
        got = model.run(inputs)
        for (name, value), want in zip(got.items(), session.run(None, inputs)):
            np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{fixture} {name} at {batch}x{length}")


def test_a_sequence_longer_than_the_position_table_is_refused(bert):
    _, so, meta = bert
    assert meta["signature"]["dim_ranges"] == {"seq": [1, 512]}
    model = aotc.load(so)
    with pytest.raises(InputMismatchError, match="dim 'seq' is 513; this model takes 1 to 512"):
        model.run(_feed(model.signature.input_names(), 1, 513))
    with pytest.raises(InputMismatchError,
                       match=r"expected shape \['batch', 'seq'\], got \[2, 0\]"):
        model.run(_feed(model.signature.input_names(), 2, 0))


def test_input_range_narrows_a_dim_and_bad_ones_are_refused(bert, tmp_path):
    onnx_path, _, _ = bert
    options = aotc.CompileOptions(dim_ranges={"seq": (1, 64), "batch": (1, 8)})
    meta = aotc.compile(onnx_path, output=tmp_path / "short.so", options=options)
    assert meta["signature"]["dim_ranges"] == {"seq": [1, 64], "batch": [1, 8]}
    model = aotc.load(tmp_path / "short.so")
    assert model.run(_feed(model.signature.input_names(), 8, 64))[
        "last_hidden_state"].shape == (8, 64, 64)
    with pytest.raises(InputMismatchError, match="dim 'batch' is 9"):
        model.run(_feed(model.signature.input_names(), 9, 4))
    with pytest.raises(AotcError, match=r"--input-range names \['tokens'\]"):
        aotc.compile(onnx_path, output=tmp_path / "bad.so",
                     options=aotc.CompileOptions(dim_ranges={"tokens": (1, 4)}))


def test_an_if_on_an_input_runs_either_branch_or_is_bound(tmp_path):
    """Branches of different shapes: a Relax If in the library, one branch runs per call (it
    was refused: aotc computed both branches and selected, which needs one shape). With --bind
    the If is folded away and the input leaves the signature."""
    path = tmp_path / "vad.onnx"
    onnx.save(if_on_an_input(), path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(32).astype(np.float32)
    aotc.compile(path, output=tmp_path / "vad.so")
    model = aotc.load(tmp_path / "vad.so")
    for rate, shape in [(16000, (4, 8)), (8000, (2, 16))]:
        feed = {"x": x, "sr": np.array(rate, np.int64)}
        got, want = model.run(feed)["y"], session.run(None, feed)[0]
        assert got.shape == shape
        np.testing.assert_array_equal(got, want)
    meta = aotc.compile(path, output=tmp_path / "vad16k.so",
                        options=aotc.CompileOptions(bound_inputs={"sr": [16000]}))
    assert [t["name"] for t in meta["signature"]["inputs"]] == ["x"]
    assert meta["signature"]["outputs"][0]["shape"] == [4, 8]
    want = session.run(None, {"x": x, "sr": np.array(16000)})[0]
    np.testing.assert_array_equal(aotc.load(tmp_path / "vad16k.so").run({"x": x})["y"], want)
    with pytest.raises(AotcError, match=r"--bind names unknown input\(s\) \['rate'\]"):
        aotc.compile(path, output=tmp_path / "bad.so",
                     options=aotc.CompileOptions(bound_inputs={"rate": [1]}))


@pytest.fixture(scope="module")
def bert_buckets(bert, tmp_path_factory):
    onnx_path, _, _ = bert
    out = tmp_path_factory.mktemp("buckets") / "bert_buckets.so"
    options = aotc.CompileOptions(buckets={"seq": (8, 32), "batch": (1, 2)})
    return onnx_path, out, aotc.compile(onnx_path, output=out, options=options)


def test_buckets_dispatch_pad_and_crop(bert_buckets):
    """Lengths inside a bucket run padded in it; a batch or length past every bucket runs the
    symbolic entry. Every answer matches onnxruntime on the unpadded input."""
    onnx_path, so, meta = bert_buckets
    assert meta["buckets"]["dims"] == {"batch": [1, 2], "seq": [8, 32]}
    assert sorted(meta["buckets"]["entries"].values()) == [
        "main_batch1_seq32", "main_batch1_seq8", "main_batch2_seq32", "main_batch2_seq8"]
    model = aotc.load(so)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for batch, length in [(1, 5), (2, 32), (1, 9), (1, 33), (3, 7)]:
        inputs = _feed(model.signature.input_names(), batch, length)
        got = model.run(inputs)
        for (name, value), want in zip(got.items(), session.run(None, inputs)):
            assert value.shape == want.shape, (name, batch, length)
            np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} at {batch}x{length}")


def test_a_bucketed_library_loads_without_warnings(bert_buckets):
    """The compile times its buckets on an exported copy of the library: running the
    in-memory executable instead leaves empty memory scopes in it, which every load of the
    library then reported, one warning per constant."""
    _, so, _ = bert_buckets
    done = subprocess.run([sys.executable, "-c", f"import aotc; aotc.load({str(so)!r})"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr[-2000:]


@pytest.mark.in_process
def test_a_call_that_pads_more_than_the_symbolic_entry_costs_runs_symbolic(bert_buckets):
    """The compiler times the symbolic entry against each bucket (at the bucket's size); the
    runtime pads into a bucket only while the padding (bucket / real size) is at most that
    ratio. Either way the answer is the same."""
    from aotc.runtime.model import Model
    onnx_path, so, meta = bert_buckets
    costs = meta["buckets"]["symbolic_cost"]
    assert sorted(costs) == sorted(meta["buckets"]["entries"])
    assert all(c > 0 for c in costs.values())
    model = Model(so)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    inputs = _feed(model.signature.input_names(), 1, 20)  # the 32 bucket: padding 1.6
    want = session.run(None, inputs)
    for cost, entry in [(10.0, "main_batch1_seq32"), (1.5, "main")]:
        model._buckets["symbolic_cost"] = {key: cost for key in costs}
        assert model._bucket_for({"batch": 1, "seq": 20})[0] == entry
        for value, expect in zip(model.run(inputs).values(), want):
            np.testing.assert_allclose(value, expect, rtol=1e-4, atol=1e-4, err_msg=entry)
    assert model._bucket_for({"batch": 1, "seq": 32})[0] == "main_batch1_seq32"  # no padding


def _mean_over_sequence() -> onnx.ModelProto:
    """[batch, seq, 4] -> mean over seq: zeros added by padding change the mean (no mask)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)], "mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_buckets_are_refused_for_a_model_that_does_not_mask_padding(tmp_path):
    onnx.save(_mean_over_sequence(), tmp_path / "mean.onnx")
    options = aotc.CompileOptions(buckets={"seq": (8, 16)})
    with pytest.raises(UnsupportedModelError, match="changes output 'y'; the model does not "
                                                    "mask the padding"):
        aotc.compile(tmp_path / "mean.onnx", output=tmp_path / "mean.so", options=options)
    assert not (tmp_path / "mean.so").exists()
    with pytest.raises(AotcError, match=r"--buckets names \['tokens'\]"):
        aotc.compile(tmp_path / "mean.onnx", output=tmp_path / "bad.so",
                     options=aotc.CompileOptions(buckets={"tokens": (8,)}))


def test_the_same_export_with_fixed_shapes_fuses_its_gelu_and_matches_onnxruntime(gpt2,
                                                                                   tmp_path):
    """Fixed at 37 tokens, the exported MLP's reshapes around its GELU (ElementwiseUnderReshape)
    no longer keep the GELU out of the first matmul's epilogue."""
    path, _, _ = gpt2
    meta = aotc.compile(path, output=tmp_path / "gpt2_37.so",
                        input_shapes={"input_ids": (1, 37), "attention_mask": (1, 37)})
    names = [kernel["name"] for kernel in meta["kernels"]]
    assert any("matmul" in n and "tanh" in n for n in names), names
    model = aotc.load(tmp_path / "gpt2_37.so")
    inputs = _feed(model.signature.input_names(), 1, 37)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for (name, value), want in zip(model.run(inputs).items(), session.run(None, inputs)):
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-4, err_msg=name)

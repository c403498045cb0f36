"""Decoders that generate with a KV cache (compiler/kv_cache.py, runtime/generate.py): the
entries' IR before and after, a GPT-2 exported with past keys and values (small sizes)
against onnxruntime token by token, the cache written in place, and refusals that name
their reason."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax
from tvm.script import relax as R
from tvm.script import tirx as T

import aotc
from aotc.compiler import kv_cache
from aotc.errors import AotcError, InputMismatchError, ModelRunError, UnsupportedModelError
from aotc.examples import decoders
from aotc.options import CompileOptions
from aotc.targets import x86

# one xdist worker runs this module: its module-scoped builds are made once
pytestmark = pytest.mark.xdist_group("test_kv_cache")

SIZES = {"layers": 2, "heads": 4, "width": 64, "vocabulary": 1000}
CAPACITY = 48


@pytest.fixture(scope="module")
def gpt2_onnx(tmp_path_factory):
    return decoders.export_gpt2(tmp_path_factory.mktemp("decoder"), **SIZES)


@pytest.fixture(scope="module")
def gpt2_so(gpt2_onnx, tmp_path_factory):
    out = tmp_path_factory.mktemp("decoder_so") / "gpt2.so"
    aotc.compile(gpt2_onnx, output=out, options=CompileOptions(kv_capacity=CAPACITY))
    return out


# --- the entries' IR ------------------------------------------------------------------------

def _before() -> tvm.IRModule:
    @R.function
    def main(input_ids: R.Tensor((1, "s"), "int64"), attention_mask: R.Tensor((1, "t"), "int64"),
             past: R.Tensor((1, 2, "p", 4), "float32")):
        s = T.int64()
        with R.dataflow():
            x = R.astype(input_ids, "float32")
            new = R.broadcast_to(R.reshape(x, R.shape([1, 1, s, 1])), R.shape([1, 2, s, 4]))
            present = R.concat((past, new), axis=2)
            logits = R.sum(present, axis=[2])
            gv = (logits, present)
            R.output(gv)
        return gv
    return tvm.IRModule({"main": main.with_attr("global_symbol", "main")})


def _signature():
    from aotc.runtime.signature import ModelSignature, TensorSpec
    return ModelSignature(
        (TensorSpec("input_ids", (1, "s"), "int64"), TensorSpec("attention_mask", (1, "t"),
                                                                "int64"),
         TensorSpec("past", (1, 2, "p", 4), "float32")),
        (TensorSpec("logits", (1, 2, 4), "float32"),
         TensorSpec("present", (1, 2, "t", 4), "float32")))


def _expected(decode: bool) -> relax.Function:
    capacity, rows = 16, (1 if decode else None)
    bb = relax.BlockBuilder()
    write = bb.add_func(kv_cache._write_kernel([1, 2, capacity, 4], 2, "float32", capacity,
                                               decode), "aotc_kv_write")
    s = tvm.tirx.Var("s", "int64")
    length = rows if decode else s
    ids = relax.Var("input_ids", relax.TensorType((1, length), "int64"))
    mask = relax.Var("attention_mask", relax.TensorType((1, capacity if decode else s), "int64"))
    cache = relax.Var("past", relax.TensorType((1, 2, capacity, 4), "float32"))
    position = relax.Var("cache_position", relax.TensorType((1,), "int64"))
    params = [ids, mask, cache] + ([position] if decode else [])
    with bb.function("main", params):
        with bb.dataflow():
            x = bb.emit(relax.op.astype(ids, "float32"))
            new = bb.emit(relax.op.broadcast_to(relax.op.reshape(x, (1, 1, length, 1)),
                                                (1, 2, length, 4)))
            if decode:
                present = bb.emit(relax.call_tir_inplace(
                    write, [cache, new, position], [0],
                    relax.TensorType((1, 2, capacity, 4), "float32")))
                logits = bb.emit(relax.op.sum(present, axis=[2]))
            else:  # attention reads the new values; the written cache is the output
                present = bb.emit(relax.call_tir_inplace(
                    write, [cache, new], [0], relax.TensorType((1, 2, capacity, 4), "float32")))
                logits = bb.emit(relax.op.sum(new, axis=[2]))
            out = bb.emit_output(relax.Tuple([logits, present]))
        bb.emit_func_output(out)
    return bb.get()["main"]


@pytest.mark.parametrize("entry", ["decode", "prefill"])
def test_entries_write_the_cache_in_place(entry):
    before = _before()
    signature = _signature()
    roles = kv_cache.find_roles(before, signature, "test")
    assert (roles.past, roles.new, roles.total, roles.axis) == ("p", "s", "t", 2)
    after = kv_cache.entries(before, signature, roles, 16)[entry]
    expected = _expected(entry == "decode").with_attr("global_symbol", "main")
    tvm.ir.assert_structural_equal(after["main"], expected, map_free_vars=True)


def test_not_a_decoder_is_refused(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(UnsupportedModelError, match="not a decoder exported with past"):
        aotc.compile(path, output=tmp_path / "relu.so", options=CompileOptions(kv_capacity=16))


def test_capacity_must_hold_two_tokens():
    with pytest.raises(ValueError, match="at least 2"):
        CompileOptions(kv_capacity=1)


# --- a GPT-2 with past, end to end ----------------------------------------------------------

def _onnxruntime_logits(path, tokens, prompt: int) -> np.ndarray:
    """Teacher-forced, as the export is meant to run: the prompt with an empty past, then
    one token at a time with the returned present values."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(path))
    inputs = [i.name for i in session.get_inputs()]
    heads, dim = SIZES["heads"], SIZES["width"] // SIZES["heads"]
    past = {n: np.zeros((1, heads, 0, dim), np.float32) for n in inputs[3:]}
    rows, start = [], 0
    for stop in [prompt] + list(range(prompt + 1, len(tokens) + 1)):
        feed = {"input_ids": tokens[None, start:stop], "attention_mask": np.ones((1, stop),
                                                                                np.int64),
                "position_ids": np.arange(start, stop)[None], **past}
        out = session.run(None, feed)
        rows.append(out[0][0, -1])
        past = dict(zip(inputs[3:], out[1:]))
        start = stop
    return np.stack(rows)


def test_generation_matches_onnxruntime_token_by_token(gpt2_onnx, gpt2_so):
    tokens = np.random.default_rng(3).integers(0, SIZES["vocabulary"], 40)
    model = aotc.load(gpt2_so)
    assert model.metadata["generation"]["capacity"] == CAPACITY
    got = model.generation_logits(tokens, prompt_length=11)
    want = _onnxruntime_logits(gpt2_onnx, tokens, 11)
    assert got.shape == want.shape == (30, SIZES["vocabulary"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # greedy decoding picks onnxruntime's tokens
    generated = model.generate(tokens[:11], 20)
    assert len(generated.tokens) == 20 and len(generated.decode_ms) == 19
    forced = np.concatenate([tokens[:11], generated.tokens[:-1]])
    assert generated.tokens == [int(np.argmax(r)) for r in
                                _onnxruntime_logits(gpt2_onnx, forced, 11)]


def test_the_symbolic_entry_still_runs_with_an_empty_past(gpt2_onnx, gpt2_so):
    import onnxruntime as ort
    model = aotc.load(gpt2_so)
    heads, dim = SIZES["heads"], SIZES["width"] // SIZES["heads"]
    feed = {"input_ids": np.arange(7)[None], "attention_mask": np.ones((1, 7), np.int64),
            "position_ids": np.arange(7)[None],
            **{n: np.zeros((1, heads, 0, dim), np.float32)
               for n in decoders.input_names(SIZES["layers"])[3:]}}
    got = model.run(feed, entry="main")
    want = ort.InferenceSession(str(gpt2_onnx)).run(None, feed)
    np.testing.assert_allclose(got["logits"], want[0], rtol=1e-4, atol=1e-4)


def test_capacity_and_order_are_checked(gpt2_so):
    model = aotc.load(gpt2_so)
    with pytest.raises(InputMismatchError, match="cache holds"):
        model.generate(np.zeros(40, np.int64), 10)  # 40 + 10 - 1 > 48
    with pytest.raises(InputMismatchError, match="holds 1 to 48"):
        model.generation_logits(np.zeros(49, np.int64), 49)


def test_a_model_without_the_cache_entries_says_how(tiny_so):
    with pytest.raises(ModelRunError, match="--kv-capacity"):
        aotc.load(tiny_so).generate([1, 2], 2)


@pytest.mark.in_process
def test_decode_writes_into_the_session_caches(gpt2_so):
    """The caches are allocated once; decode writes the new token's key and value into
    them at its position (no copy per token)."""
    from aotc.runtime import load
    session = load(gpt2_so).cache_session()
    caches = [np.from_dlpack(c) for c in session.caches]
    session.prefill(np.array([5, 6, 7]))
    assert all(np.any(c[:, :, :3] != 0) and not np.any(c[:, :, 3:]) for c in caches)
    session.decode(8)
    assert all(np.any(c[:, :, 3] != 0) and not np.any(c[:, :, 4:]) for c in caches)
    assert session.length == 4


@pytest.mark.slow
def test_an_export_that_counts_positions_itself_is_refused(tmp_path):
    path = decoders.export_gpt2(tmp_path, positions=False, **SIZES)
    with pytest.raises(AotcError, match="position_ids"):
        aotc.compile(path, output=tmp_path / "g.so", options=CompileOptions(kv_capacity=32))
    assert not (tmp_path / "g.so").exists()


@pytest.mark.skipif(not x86._BF16_FLAGS <= x86.cpu_flags(),
                    reason="--precision bf16 needs AVX512-BF16 on this CPU")
def test_a_bf16_build_checks_its_entries_within_bf16_and_still_refuses_a_bad_export(
        gpt2_onnx, tmp_path):
    """In a bf16 build the entries may round at other points than main (on AMX a decode row
    takes a vector kernel, main's rows tiles): the check allows REDUCED_PRECISION_SHARE of the
    largest logit, and an export that counts positions itself still moves the logits past
    it."""
    out = tmp_path / "bf16.so"
    aotc.compile(gpt2_onnx, output=out, options=CompileOptions(kv_capacity=CAPACITY,
                                                                precision="bf16"))
    tokens = np.random.default_rng(3).integers(0, SIZES["vocabulary"], 12)
    got = aotc.load(out).generation_logits(tokens, 8)
    want = _onnxruntime_logits(gpt2_onnx, tokens, 8)
    assert np.abs(got - want).max() <= kv_cache.REDUCED_PRECISION_SHARE * np.abs(want).max()
    bad = decoders.export_gpt2(tmp_path, positions=False, **SIZES)
    with pytest.raises(AotcError, match="position_ids"):
        aotc.compile(bad, output=tmp_path / "bad.so",
                     options=CompileOptions(kv_capacity=CAPACITY, precision="bf16"))


def test_cli_generates(gpt2_so, tmp_path):
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "aotc.cli", "run", str(gpt2_so), "--generate",
                          "6", "--prompt", "1,2,3", "--json", str(tmp_path / "g.json")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "prompt (3 tokens): 1 2 3" in out.stdout and "tokens/s" in out.stdout
    report = json.loads((tmp_path / "g.json").read_text())
    assert len(report["tokens"]) == 6 and report["prompt"] == [1, 2, 3]
    refused = subprocess.run([sys.executable, "-m", "aotc.cli", "run", str(gpt2_so),
                              "--generate", "60", "--prompt", "1,2,3"],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "cache holds 48" in refused.stderr


@pytest.mark.parametrize("entry", [None, "prefill", "main"])
def test_profile_takes_an_entry(gpt2_so, entry):
    import subprocess
    import sys
    command = [sys.executable, "-m", "aotc.cli", "profile", str(gpt2_so), "--runs", "3",
               "--top", "0", "--dim", "sequence_length=8"] + (["--entry", entry] if entry else [])
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "kernels, sum" in out.stdout
    names = [line.split()[0] for line in out.stdout.splitlines()[1:-1]]
    if entry is None:  # decode: every kernel it calls, the KV write among them
        assert any("kv_write" in n for n in names), names
    if entry == "main":  # the exported graph: concatenation, no cache writes
        assert not any("kv_write" in n for n in names), names

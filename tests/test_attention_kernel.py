"""One-kernel attention end to end: ONNX attention graphs (scale, causal mask, ragged and whole
sequence lengths) compile to one attention kernel that the Attention rule schedules, and match
onnxruntime; the rule's schedule keeps the score matrix to one row block per parallel task."""

import numpy as np
import onnx
import pytest
import tvm
from helpers import check_against_onnxruntime
from kernel_helpers import loops_spilling_vectors
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from aotc.compiler.default_schedules.cpu_rules import Attention
from aotc.compiler.passes.fusion import FuseAttention
from aotc.targets import resolve

TARGET = tvm.target.Target(resolve("x86").tvm_target)


def _attention_onnx(path, seq, heads=3, dim=16, causal=True):
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "scale"], ["ss"])]
    inits = [numpy_helper.from_array(np.array(dim ** 0.5, np.float32), "scale")]
    last = "ss"
    if causal:
        mask = np.triu(np.full((seq, seq), -np.inf, np.float32), k=1)
        inits.append(numpy_helper.from_array(mask, "mask"))
        nodes.append(helper.make_node("Add", ["ss", "mask"], ["sm"]))
        last = "sm"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = [1, heads, seq, dim]
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                             for n in ("q", "k", "v")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("seq, causal, target, dim", [
    (197, False, "x86", 16), (128, True, "x86", 16), (13, True, "x86", 16),
    (197, False, "x86-avx2", 16), (13, True, "x86-avx2", 16),  # AVX2's tiles, any x86 host
    (1100, True, "x86", 64)])  # long keys: tasks of 24 rows (rows_per_task)
def test_attention_is_one_kernel_and_matches_onnxruntime(seq, causal, target, dim, tmp_path):
    path = _attention_onnx(tmp_path / f"attention{seq}.onnx", seq, causal=causal, dim=dim)
    model, _ = check_against_onnxruntime(path, tmp_path, rtol=1e-5, atol=1e-5, target=target)
    kernels = [k["name"] for k in model.metadata["kernels"]]
    assert sum("softmax" in name for name in kernels) == 1, kernels
    assert not any(name in ("softmax", "matmul1", "matmul2") for name in kernels)


def _fused_attention_primfunc(seq):
    """The kernel FuseAttention and FuseTIR make of 2 heads of 64 of ``seq`` tokens (rows and
    keys padded: to 8 rows and 16 keys)."""
    q = relax.Var("q", relax.TensorType((1, 2, seq, 64), "float32"))
    kt = relax.Var("kt", relax.TensorType((1, 2, 64, seq), "float32"))
    v = relax.Var("v", relax.TensorType((1, 2, seq, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, kt, v]):
        with bb.dataflow():
            s = bb.emit(relax.op.divide(relax.op.matmul(q, kt), relax.const(8.0, "float32")))
            out = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(s, axis=-1), v))
        bb.emit_func_output(out)
    mod = FuseAttention()(bb.get())
    for pass_ in (relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                  relax.transform.FuseOps(), relax.transform.FuseTIR()):
        mod = pass_(mod)
    return [f for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and "softmax" in gv.name_hint][0]


def test_attention_rule_keeps_scores_per_row_block():
    with TARGET:
        sch = Attention().apply(_fused_attention_primfunc(128), TARGET, False)
    assert sch is not None
    root_loops = sch.get_loops(sch.get_sblock("matmul1_update"))
    assert sch.get(root_loops[0]).kind == tvm.tirx.ForKind.PARALLEL
    # every block of the kernel sits under the one parallel loop: the scores, softmax and
    # output of a row block are computed there, not as passes over the whole matrix
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        assert sch.get(sch.get_loops(block)[0]).same_as(sch.get(root_loops[0]))


def test_the_scale_is_applied_as_the_score_tile_is_written():
    """The scaled (and masked) scores are written by the score tile's write-back: no block of
    their own, which would be one more pass over the row block's scores."""
    func = _fused_attention_primfunc(128)
    assert 'T.sblock("T_divide")' in tvm.IRModule({"main": func}).script()
    with TARGET:
        sch = Attention().apply(func, TARGET, False)
    script = sch.mod.script()
    assert 'T.sblock("T_divide")' not in script
    assert 'T.sblock("matmul_intermediate_global")' in script


def test_avx2_tiles_leave_the_broadcast_a_register():
    """Built for AVX2 (no embedded-broadcast operand), both products take cpu_dot.tile_shape's
    tile for 16 registers, 4 rows x 2 vectors of a 64-wide head (8 rows x 2 vectors, the
    AVX-512 tile, spilled), and no multiply-add loop moves a vector to or from the stack;
    the kernel matches numpy."""
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    func = _fused_attention_primfunc(128).with_attr("global_symbol", "main")
    with avx2:
        sch = Attention().apply(func, avx2, False)
    for block in ("matmul_update", "matmul1_update"):  # the scores, the output
        loops = sch.get_loops(sch.get_sblock(block))
        assert [int(sch.get(loop).extent) for loop in loops[-3:-1]] == [4, 2], block
    lib = tvm.compile(sch.mod, target=avx2)
    assert loops_spilling_vectors(lib.mod.inspect_source("asm")) == []
    _assert_kernel_matches_numpy(lib, 128, 128)


def _assert_kernel_matches_numpy(lib, tokens: int, padded: int):
    """The built kernel of _fused_attention_primfunc(tokens), its rows and keys padded to
    ``padded``, on random inputs against numpy. Its parameters: q, kt, the divisor (which
    FuseOps made a parameter), the key mask where keys were padded (0 for real keys, the lowest
    float for the padding), v, the output."""
    rng = np.random.default_rng(0)
    q, kt, v = (rng.standard_normal(shape).astype(np.float32)
                for shape in ((1, 2, padded, 64), (1, 2, 64, padded), (1, 2, padded, 64)))
    mask = np.zeros(padded, np.float32)
    mask[tokens:] = np.finfo(np.float32).min
    scores = q @ kt / 8.0 + mask
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    got = tvm.runtime.empty(want.shape, "float32")
    scale = np.array(8.0, np.float32)
    inputs = (q, kt, scale, mask, v) if padded > tokens else (q, kt, scale, v)
    lib["main"](*(tvm.runtime.tensor(a) for a in inputs), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seq, tasks", [(128, 2 * 128 // 8), (1100, 2 * 1104 // 24)])
def test_long_keys_take_tasks_of_more_rows(seq, tasks):
    """Where K and V of a head (2 x keys x 64 floats) exceed LONG_KEYS_BYTES, a parallel task
    takes more query rows: 1,104 padded rows (565 KB of K and V) go 24 to a task (32 does not
    divide them), 128 (64 KB) keep 8; the long kernel matches numpy."""
    func = _fused_attention_primfunc(seq).with_attr("global_symbol", "main")
    with TARGET:
        sch = Attention().apply(func, TARGET, False)
    task = sch.get_loops(sch.get_sblock("matmul1_update"))[0]
    assert int(sch.get(task).extent) == tasks
    if seq < 1000:
        return
    _assert_kernel_matches_numpy(tvm.compile(sch.mod, target=TARGET), seq, 1104)

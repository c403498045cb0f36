"""RemoveIdentityBroadcast: no-op broadcast_to calls go, real broadcasts stay, outputs match."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper
from tvm.script import relax as R

from aotc.compiler.passes import RemoveIdentityBroadcast


def _module():
    @R.function
    def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((1, 3), "float32")):
        with R.dataflow():
            same = R.broadcast_to(x, R.shape([2, 3]))
            wider = R.broadcast_to(y, R.shape([2, 3]))
            out = R.add(same, wider)
            R.output(out)
        return out

    return tvm.IRModule({"main": main})


def test_identity_broadcast_is_removed_and_real_one_kept():
    @R.function
    def expected(x: R.Tensor((2, 3), "float32"), y: R.Tensor((1, 3), "float32")):
        with R.dataflow():
            wider = R.broadcast_to(y, R.shape([2, 3]))
            out = R.add(x, wider)
            R.output(out)
        return out

    after = RemoveIdentityBroadcast()(_module())
    tvm.ir.assert_structural_equal(after["main"], expected.with_attr("global_symbol", "main"))
    x, y = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32).reshape(1, 3)
    assert np.array_equal(_run(after, x, y), _run(_module(), x, y))


def _run(mod, *args):
    exe = tvm.compile(mod, target="llvm")
    vm = tvm.relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_onnx_sum_with_mixed_shapes_matches_onnxruntime(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Sum", ["a", "b", "c"], ["y"])], "sum",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4, 5]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 4, 5]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 5])])
    path = tmp_path / "sum_mixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    rng = np.random.default_rng(0)
    feed = {"a": rng.standard_normal((2, 4, 5)).astype(np.float32),
            "b": rng.standard_normal((2, 4, 5)).astype(np.float32),
            "c": rng.standard_normal((1, 4, 1)).astype(np.float32)}
    check_against_onnxruntime(path, tmp_path, feed=feed)

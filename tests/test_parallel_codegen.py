"""compiler/parallel_codegen.py: kernels compiled on several threads give the same model."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx_builders import tiny_cnn
from tvm.script import tirx as T

from aotc.compiler import parallel_codegen
from aotc.runtime.inputs import random_inputs


def _kernel(name: str):
    @T.prim_func(s_tir=True)
    def kernel(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("copy"):
                vi = T.axis.remap("S", [i])
                b[vi] = a[vi]
    return kernel.with_attr("global_symbol", name)


def test_split_deals_every_function_once_and_keeps_module_attributes(monkeypatch):
    funcs = {tvm.ir.GlobalVar(f"k{i}"): _kernel(f"k{i}") for i in range(9)}
    mod = tvm.IRModule(funcs, attrs={"runtime": "cpp-ish"})
    groups = parallel_codegen.split(mod, 2)
    names = [sorted(gv.name_hint for gv in g.get_global_vars()) for g in groups]
    assert names == [["k0", "k2", "k4", "k6", "k8"], ["k1", "k3", "k5", "k7"]]
    assert all(g.attrs["runtime"] == "cpp-ish" for g in groups)
    # at least MIN_KERNELS_PER_GROUP (4) kernels per module: 9 kernels on 8 workers -> 2
    assert [len(g.functions) for g in parallel_codegen.split(mod, 8)] == [5, 4]
    small = tvm.IRModule(dict(list(funcs.items())[:7]))
    assert [len(g.functions) for g in parallel_codegen.split(small, 2)] == [7]
    monkeypatch.setattr(parallel_codegen, "MIN_KERNELS_PER_GROUP", 1)
    assert [len(g.functions) for g in parallel_codegen.split(mod, 8)] == [2] + [1] * 7
    assert parallel_codegen.split(tvm.IRModule({}), 2) == []


def test_a_model_without_kernels_builds(tmp_path):
    """An Identity has no PrimFunc to compile: the VM returns its input."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "identity",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "identity.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]),
              path)
    check_against_onnxruntime(path, tmp_path)


def test_models_built_on_one_and_on_three_threads_match(tmp_path, monkeypatch):
    path = tmp_path / "tiny_cnn.onnx"
    onnx.save(tiny_cnn(), path)
    monkeypatch.setattr(parallel_codegen, "MIN_KERNELS_PER_GROUP", 1)  # tiny_cnn: few kernels
    outputs = {}
    for workers in (1, 3):
        monkeypatch.setattr(parallel_codegen, "default_threads", lambda w=workers: w)
        model, _ = check_against_onnxruntime(path, tmp_path / f"w{workers}", rtol=1e-4,
                                             atol=1e-5)
        outputs[workers] = model.run(random_inputs(model.signature, seed=3))
    for name, value in outputs[1].items():
        np.testing.assert_array_equal(outputs[3][name], value)


def test_export_writes_the_library_tvm_writes(tmp_path, monkeypatch):
    """build.export_library writes the kernels' objects on several threads; the library is
    byte for byte the one TVM's own export_library links from the same modules."""
    from tvm import relax

    from aotc.compiler.build import export_library
    from aotc.compiler.packed_imports import imports_packer

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for op in (relax.op.exp, relax.op.negative, relax.op.abs, relax.op.sqrt):
                y = bb.emit(op(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    monkeypatch.setattr(parallel_codegen, "MIN_KERNELS_PER_GROUP", 1)
    pipeline = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                         relax.get_pipeline("default")])
    executable = parallel_codegen.build(bb.get(), target, pipeline, workers=2)
    assert len(executable.mod._collect_dso_modules()) == 2
    libraries = {}
    for name in ("ours", "tvm"):
        work = tmp_path / name
        work.mkdir()
        path = str(work / "lib.so")
        if name == "ours":
            export_library(executable, path, [], str(work), None, imports_packer("x86_64"))
        else:
            executable.export_library(path, workspace_dir=str(work),
                                      fpack_imports=imports_packer("x86_64"))
        libraries[name] = (work / "lib.so").read_bytes()
    assert libraries["ours"] == libraries["tvm"]

"""ONNX BitCast (opset 26: reinterpret the bits as another type of the same width). TVM has no
converter and Relax no op for it; a small elementwise kernel reinterprets each element."""

from __future__ import annotations

import onnx
import tvm
from tvm import relax

from aotc.errors import UnsupportedModelError

from ..tvmscript import parsed
from .relax_shapes import static_shape

_SOURCE = """
@T.prim_func(private=True, s_tir=True)
def bitcast(x: T.Buffer(({dims}), "{src}"), y: T.Buffer(({dims}), "{dst}")):
    T.func_attr({{"tirx.noalias": True}})
    {loop}
        with T.sblock("bitcast"):
            {body}
"""


def _kernel(shape: list[int], src: str, dst: str) -> tvm.tirx.PrimFunc:
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    names = [f"i{k}" for k in range(len(shape))]
    at = ", ".join(names) if names else "()"
    # bool is one byte holding 0 or 1: its bits are its value
    value = f"T.Cast(\"{dst}\", x[{at}])" if src == "bool" else \
        f"T.reinterpret(\"{dst}\", x[{at}])"
    loop = f"for {', '.join(names)} in T.grid({dims}):" if names else "if True:"
    source = _SOURCE.format(dims=dims or "", src=src, dst=dst, loop=loop,
                            body=f"y[{at}] = {value}")
    return parsed(source)


def bitcast(bb, inputs, attrs, opset, params):
    data = inputs[0]
    shape = static_shape(data)
    if shape is None:
        return None
    src = str(data.ty.dtype)
    dst = str(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"]))
    if tvm.DataType(src).bits != tvm.DataType(dst).bits and src != "bool":
        raise UnsupportedModelError(f"BitCast from {src} to {dst}: the widths differ")
    gv = bb.add_func(_kernel(shape, src, dst), "aotc_bitcast")
    return relax.call_tir(gv, [data], relax.TensorType(shape, dst))

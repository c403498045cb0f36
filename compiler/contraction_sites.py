"""The contractions with a packed kernel (int8, bf16, prepacked float32): the sites that
calibration observes, annotate quantizes and the packing passes rewrite, found the same way
by all so that their names agree.

A site is a conv2d (NHWC data, HWIO weights, one group: the layout phase made them so) or a
matmul whose weight is a float32 constant and whose activation is float32 with a static
shape. Depthwise and grouped convolutions, and matmuls of two activations (attention's
Q.K^T and .V), have no int8 kernel and stay float32: without a dot product over channels,
converting the bytes costs more than reading them saves. Sites are named by kind and order
("conv2d_0", "matmul_3"); the names are what --skip-layers takes and the report prints."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .frontends.relax_shapes import static_shape


@dataclass(frozen=True)
class Site:
    name: str
    var: relax.Var            # the binding's variable
    call: relax.Call          # conv2d / matmul
    activation: relax.Expr    # the float32 input int8 replaces
    weight_axis: int          # output-channel axis of the constant weight

    def weight(self) -> np.ndarray:
        """The constant weight's values, read in place (a view of the constant's memory, not
        a copy: a large model's packing passes read hundreds of MB of them). Read only."""
        return np.from_dlpack(self.call.args[1].value)


def _float_tensor(expr: relax.Expr, rank: int | None = None) -> bool:
    info = expr.ty
    if not isinstance(info, relax.TensorType) or info.dtype != "float32":
        return False
    shape = static_shape(expr)
    return shape is not None and (rank is None or len(shape) == rank)


def _conv_site(call: relax.Call) -> bool:
    attrs = call.attrs
    return (attrs.data_layout == "NHWC" and attrs.kernel_layout == "HWIO"
            and attrs.out_layout == "NHWC" and int(attrs.groups) == 1
            and _float_tensor(call.args[0], 4))


def grouped_conv_site(call: relax.Call) -> bool:
    """A grouped conv2d (NHWC, HWIO) of more than one input channel a group: PrepackWeights
    packs these too (find_sites' ``grouped``); depthwise convs have their own schedule."""
    attrs = call.attrs
    return (call.op.name == "relax.nn.conv2d" and attrs.data_layout == "NHWC"
            and attrs.kernel_layout == "HWIO" and attrs.out_layout == "NHWC"
            and int(attrs.groups) > 1 and int(call.args[1].value.shape[2]) > 1
            and _float_tensor(call.args[0], 4))


def _matmul_site(call: relax.Call) -> bool:
    weight = call.args[1]
    return (len(weight.value.shape) == 2 and _float_tensor(call.args[0])
            and len(static_shape(call.args[0])) >= 2)


def symbolic_rows_matmul(call: relax.Call) -> bool:
    """A matmul site but for its activation's leading dims (batch, sequence), which are
    symbolic: only PrepackWeights takes these (it pads the rows); calibration, int8 and the
    other packings see static sites only."""
    if call.op.name != "relax.matmul" or not isinstance(call.args[1], tvm.ir.GenericConst):
        return False
    weight, info = call.args[1], call.args[0].ty
    if weight.value.dtype != "float32" or len(weight.value.shape) != 2:
        return False
    if not isinstance(info, relax.TensorType) or info.dtype != "float32" or info.shape is None:
        return False
    dims = list(info.shape.values)
    return (len(dims) >= 2 and isinstance(dims[-1], tvm.tirx.IntImm)
            and not isinstance(dims[-2], tvm.tirx.IntImm))


KINDS = {"relax.nn.conv2d": ("conv2d", _conv_site, 3), "relax.matmul": ("matmul", _matmul_site, 1)}


def find_sites(func: relax.Function, symbolic_rows: bool = False,
               grouped: bool = False) -> list[Site]:
    """The sites of ``func`` in binding order; with ``symbolic_rows``, also the matmuls of
    symbolic_rows_matmul; with ``grouped``, also grouped convs (grouped_conv_site), named
    "grouped_conv2d_N" so that the other sites keep their names."""
    sites, counts = [], {}
    for block in getattr(func.body, "blocks", []):
        for binding in block.bindings:
            call = binding.value
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                continue
            kind = KINDS.get(call.op.name)
            if kind is None or not isinstance(call.args[1], tvm.ir.GenericConst):
                continue
            if call.args[1].value.dtype != "float32":
                continue
            name = kind[0]
            if not (kind[1](call) or (symbolic_rows and symbolic_rows_matmul(call))):
                if not (grouped and grouped_conv_site(call)):
                    continue
                name = "grouped_conv2d"
            index = counts.get(name, 0)
            counts[name] = index + 1
            sites.append(Site(f"{name}_{index}", binding.var, call, call.args[0], kind[2]))
    return sites


def main_sites(mod: tvm.IRModule) -> list[Site]:
    return find_sites(mod["main"])

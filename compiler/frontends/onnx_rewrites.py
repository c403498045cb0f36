"""ONNX-to-ONNX rewrites that run before TVM's importer, one function per op.

Why: TVM 0.27's converters give silent wrong answers for some attributes and outputs of these
ops (found by tests/conformance: LayerNormalization's Mean/InvStdDev came back as scalars,
Dropout's mask as float, IsInf ignored detect_negative/positive, ConvTranspose ignored
output_shape, Expand broadcast one-way, Mish lost precision near zero, BitShift by >= the bit
width was undefined). Each rewrite re-expresses the node in ops TVM converts correctly, as the
ONNX spec defines them; the op check has already run on the user's original graph.

A rewrite returns the nodes that replace ``node`` (outputs keep their names), or None to keep it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from aotc.errors import UnsupportedModelError

from .onnx_control import if_to_where
from .onnx_dft import dft
from .onnx_graph import GraphInfo, node_attrs
from .onnx_rnn import expand_recurrent
from .onnx_scan import unroll_scan

# Ops TVM has no converter for that aotc converts itself (the op check accepts them): here,
# or in Relax by onnx_importer (CumProd, BitCast, Loop).
OWN_CONVERTERS = ("If", "Scan", "LSTM", "GRU", "RNN", "LpNormalization", "DFT", "CumProd",
                  "BitCast", "Loop")
# Rewrites that inline subgraphs: their nodes are folded and rewritten in another round.
INLINING = ("If", "Scan")

Rewrite = Callable[[onnx.NodeProto, GraphInfo], "list[onnx.NodeProto] | None"]


def _const(info: GraphInfo, value, dtype, hint: str = "c") -> tuple[str, onnx.NodeProto]:
    name = info.fresh(hint)
    array = np.asarray(value, dtype=dtype)
    return name, helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array))


def _np_dtype(info: GraphInfo, name: str):
    elem = info.elem_type(name)
    return None if elem is None else helper.tensor_dtype_to_np_dtype(elem)


def layer_norm_stats(node, info):
    """Mean and InvStdDev (outputs 1, 2) computed as the spec defines them, over axes
    [axis, rank), in the stash type (float32); output 0 stays a LayerNormalization."""
    outputs = list(node.output)
    if len(outputs) < 2 or not any(outputs[1:]):
        return None
    rank = len(info.shape(node.input[0]) or [])
    if not rank:
        return None
    attrs = node_attrs(node)
    axis = attrs.get("axis", -1) % rank
    axes = list(range(axis, rank))
    x = info.fresh("ln_x")
    nodes = [helper.make_node("Cast", [node.input[0]], [x], to=TensorProto.FLOAT)]
    mean, diff, square, var, var_eps, std = (info.fresh(h) for h in
                                             ("mean", "d", "sq", "var", "var_eps", "std"))
    nodes += _reduce_mean(info, x, axes, outputs[1] or mean)
    nodes.append(helper.make_node("Sub", [x, outputs[1] or mean], [diff]))
    nodes.append(helper.make_node("Mul", [diff, diff], [square]))
    nodes += _reduce_mean(info, square, axes, var)
    eps_name, eps = _const(info, attrs.get("epsilon", 1e-5), np.float32, "eps")
    nodes += [eps, helper.make_node("Add", [var, eps_name], [var_eps]),
              helper.make_node("Sqrt", [var_eps], [std])]
    if len(outputs) > 2 and outputs[2]:
        nodes.append(helper.make_node("Reciprocal", [std], [outputs[2]]))
    keep = onnx.NodeProto()
    keep.CopyFrom(node)
    del keep.output[1:]
    return [keep, *nodes]


def _reduce_mean(info, x: str, axes: list[int], out: str) -> list:
    if info.opset >= 18:
        axes_name, axes_node = _const(info, axes, np.int64, "axes")
        return [axes_node, helper.make_node("ReduceMean", [x, axes_name], [out], keepdims=1)]
    return [helper.make_node("ReduceMean", [x], [out], axes=axes, keepdims=1)]


def dropout_at_inference(node, info):
    """Inference Dropout: output 0 is the input; the mask (output 1) is all True, as bool."""
    if len(node.output) < 2 or not node.output[1]:
        return None
    if len(node.input) > 2 and node.input[2]:
        training = info.constants.get(node.input[2])
        if training is None or bool(training):
            return None  # refused by the op check (onnx_gaps): not an inference graph
    shape = info.fresh("shape")
    return [helper.make_node("Identity", [node.input[0]], [node.output[0]]),
            helper.make_node("Shape", [node.input[0]], [shape]),
            helper.make_node("ConstantOfShape", [shape], [node.output[1]],
                             value=numpy_helper.from_array(np.array([True])))]


def conv_auto_pad(node, info):
    """Conv with ``auto_pad`` SAME_UPPER, SAME_LOWER or VALID -> explicit ``pads``, by the
    spec's formula (SAME: output = ceil(input / stride), the odd pixel of padding at the end
    for SAME_UPPER, at the start for SAME_LOWER). TVM's converter pads such convs with a
    kernel of its own, which the NHWC layout conversion cannot see through: transformers'
    EfficientNet (76 SAME_UPPER convs) ran a transpose, a pad and a transpose back around
    each. Needs the input's spatial dims and the kernel's size at compile time."""
    attrs = node_attrs(node)
    mode = attrs.get("auto_pad", b"NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        return None
    shape, weight = info.shape(node.input[0]), info.shape(node.input[1])
    if shape is None or weight is None:
        return None
    spatial = shape[2:]
    kernel = list(attrs.get("kernel_shape") or weight[2:])
    if None in spatial or None in kernel or len(kernel) != len(spatial):
        return None
    strides = list(attrs.get("strides") or [1] * len(spatial))
    dilations = list(attrs.get("dilations") or [1] * len(spatial))
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = 0 if mode == "VALID" else \
            max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if mode != "SAME_LOWER" else large)
        ends.append(total - begins[-1])
    kept = [a for a in node.attribute if a.name not in ("auto_pad", "pads")]
    conv = helper.make_node("Conv", list(node.input), list(node.output), name=node.name,
                            pads=begins + ends)
    conv.attribute.extend(kept)
    return [conv]


def isinf_directions(node, info):
    attrs = node_attrs(node)
    negative, positive = attrs.get("detect_negative", 1), attrs.get("detect_positive", 1)
    if negative and positive:
        return None
    x, out = node.input[0], node.output[0]
    if not negative and not positive:
        return [helper.make_node("Less", [x, x], [out])]  # false everywhere, NaN included
    inf, sign = info.fresh("isinf"), info.fresh("sign")
    zero_name, zero = _const(info, 0, _np_dtype(info, x) or np.float32, "zero")
    compare = "Greater" if positive else "Less"
    return [zero, helper.make_node("IsInf", [x], [inf]),
            helper.make_node(compare, [x, zero_name], [sign]),
            helper.make_node("And", [inf, sign], [out])]


def stable_mish(node, info):
    """mish(x) = x * tanh(ln(1 + e^x)) = x * n / (n + 2) with n = e^x (e^x + 2): no 1 + tiny
    cancellation (TVM's form was 9.5e-7 off near x = -10); x itself above 20 (tanh = 1)."""
    x, out = node.input[0], node.output[0]
    dtype = _np_dtype(info, x) or np.float32
    e, e2, n, n2, ratio, prod, big = (info.fresh(h) for h in
                                      ("e", "e2", "n", "n2", "ratio", "prod", "big"))
    two_name, two = _const(info, 2, dtype, "two")
    limit_name, limit = _const(info, 20, dtype, "limit")
    return [two, limit, helper.make_node("Exp", [x], [e]),
            helper.make_node("Add", [e, two_name], [e2]),
            helper.make_node("Mul", [e, e2], [n]),
            helper.make_node("Add", [n, two_name], [n2]),
            helper.make_node("Div", [n, n2], [ratio]),
            helper.make_node("Mul", [x, ratio], [prod]),
            helper.make_node("Greater", [x, limit_name], [big]),
            helper.make_node("Where", [big, x, prod], [out])]


def stable_softplus(node, info):
    """softplus(x) = log1p(e^x), with log1p(t) = log(u) * t / (u - 1), u = 1 + t (Kahan): exact
    where TVM's log(1 + e^x) rounds 1 + tiny; x itself above 20."""
    x, out = node.input[0], node.output[0]
    dtype = _np_dtype(info, x) or np.float32
    e, u, log_u, um1, scaled, ratio, exact, small, big = (info.fresh(h) for h in (
        "e", "u", "log_u", "um1", "scaled", "ratio", "exact", "small", "big"))
    one_name, one = _const(info, 1, dtype, "one")
    limit_name, limit = _const(info, 20, dtype, "limit")
    return [one, limit, helper.make_node("Exp", [x], [e]),
            helper.make_node("Add", [one_name, e], [u]),
            helper.make_node("Log", [u], [log_u]),
            helper.make_node("Sub", [u, one_name], [um1]),
            helper.make_node("Mul", [log_u, e], [scaled]),
            helper.make_node("Div", [scaled, um1], [ratio]),
            helper.make_node("Equal", [u, one_name], [small]),
            helper.make_node("Where", [small, e, ratio], [exact]),
            helper.make_node("Greater", [x, limit_name], [big]),
            helper.make_node("Where", [big, x, exact], [out])]


def conv_transpose_output_shape(node, info):
    """output_shape -> explicit pads (and output_padding), by the spec's formula."""
    attrs = node_attrs(node)
    if "output_shape" not in attrs:
        return None
    x_shape, w_shape = info.shape(node.input[0]), info.shape(node.input[1])
    if not x_shape or not w_shape or None in x_shape[2:] or None in w_shape[2:]:
        raise UnsupportedModelError(
            f"ConvTranspose node {node.name!r}: output_shape needs static input and kernel "
            "shapes to turn into pads (TVM ignores it); fix the shapes with --input-shape")
    pads, out_pad = output_shape_pads(attrs, x_shape[2:], w_shape[2:])
    keep = helper.make_node("ConvTranspose", list(node.input), list(node.output), name=node.name)
    for key, value in attrs.items():
        if key not in ("output_shape", "pads", "auto_pad", "output_padding"):
            keep.attribute.append(helper.make_attribute(key, value))
    keep.attribute.extend([helper.make_attribute("pads", pads),
                           helper.make_attribute("output_padding", out_pad)])
    return [keep]


def output_shape_pads(attrs: dict, spatial: list[int], kernel: list[int]):
    n = len(spatial)
    output_shape = list(attrs["output_shape"])[-n:]
    strides = list(attrs.get("strides", [1] * n))
    dilations = list(attrs.get("dilations", [1] * n))
    out_pad = list(attrs.get("output_padding", [0] * n))
    begin, end = [0] * n, [0] * n
    for i in range(n):
        total = (strides[i] * (spatial[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
                 - output_shape[i])
        if total < 0:
            out_pad[i] -= total
            total = 0
        upper = attrs.get("auto_pad", b"NOTSET") in (b"SAME_UPPER", "SAME_UPPER")
        begin[i], end[i] = (total // 2, total - total // 2) if upper else (total - total // 2,
                                                                              total // 2)
    return begin + end, out_pad


def bidirectional_expand(node, info):
    """ONNX Expand broadcasts both ways (shape [2, 1, 6] on data [3, 1] gives [2, 3, 6]); TVM
    takes the shape as the output's. A constant shape (shape arithmetic is folded first) is
    replaced by the broadcast of both. A shape or data shape known only at run time is left to
    the importer's symbolic converter (onnx_symbolic.py), which broadcasts both ways too."""
    data, shape_in = node.input[0], node.input[1]
    data_shape = info.shape(data)
    if shape_in not in info.constants or not data_shape or None in data_shape:
        return None  # known only at run time: onnx_symbolic.py broadcasts it both ways
    wanted = [int(d) for d in info.constants[shape_in]]
    full = list(np.broadcast_shapes(tuple(data_shape), tuple(wanted)))
    if full == wanted:
        return None
    name, const = _const(info, full, np.int64, "shape")
    return [const, helper.make_node("Expand", [data, name], list(node.output))]


def bitshift_out_of_range(node, info):
    """Shifts outside [0, bit width) are defined by ONNX (left: 0; right: the sign fill) but
    undefined in LLVM: select them explicitly."""
    x, y = node.input
    dtype = _np_dtype(info, x)
    if dtype is None:
        return None
    width = np.dtype(dtype).itemsize * 8
    right = node_attrs(node).get("direction") in (b"RIGHT", "RIGHT")
    names = {h: info.fresh(h) for h in ("lo", "lo_n", "hi", "ok", "safe", "shifted", "fill",
                                        "neg")}
    zero_name, zero = _const(info, 0, dtype, "zero")
    width_name, width_c = _const(info, width, dtype, "width")
    nodes = [zero, width_c,
             helper.make_node("Less", [y, zero_name], [names["lo"]]),
             helper.make_node("Less", [y, width_name], [names["hi"]]),
             helper.make_node("Not", [names["lo"]], [names["lo_n"]]),
             helper.make_node("And", [names["lo_n"], names["hi"]], [names["ok"]]),
             helper.make_node("Where", [names["ok"], y, zero_name], [names["safe"]]),
             helper.make_node("BitShift", [x, names["safe"]], [names["shifted"]],
                              direction="RIGHT" if right else "LEFT")]
    fill = zero_name
    if right and np.dtype(dtype).kind == "i":
        minus_name, minus = _const(info, -1, dtype, "minus1")
        nodes += [minus, helper.make_node("Less", [x, zero_name], [names["neg"]]),
                  helper.make_node("Where", [names["neg"], minus_name, zero_name],
                                   [names["fill"]])]
        fill = names["fill"]
    nodes.append(helper.make_node("Where", [names["ok"], names["shifted"], fill],
                                  list(node.output)))
    return nodes


def float_mod_by_infinity(node, info):
    """Mod with fmod=0 on floats is numpy's mod: a % +-inf is a when a and the divisor agree
    in sign (or a == 0), else the divisor. TVM's a - floor(a / b) * b gives NaN there."""
    attrs = node_attrs(node)
    a, b = node.input
    dtype = _np_dtype(info, a)
    if attrs.get("fmod", 0) or dtype is None or np.dtype(dtype).kind != "f":
        return None
    n = {h: info.fresh(h) for h in ("mod", "binf", "ainf", "anan", "nonfinite", "afin", "use",
                                    "zero_a", "apos", "bpos", "differ", "same", "keep",
                                    "atinf")}
    zero_name, zero = _const(info, 0, dtype, "zero")
    return [zero,
            helper.make_node("Mod", [a, b], [n["mod"]], fmod=0),
            helper.make_node("IsInf", [b], [n["binf"]]),
            helper.make_node("IsInf", [a], [n["ainf"]]),
            helper.make_node("IsNaN", [a], [n["anan"]]),
            helper.make_node("Or", [n["ainf"], n["anan"]], [n["nonfinite"]]),
            helper.make_node("Not", [n["nonfinite"]], [n["afin"]]),
            helper.make_node("And", [n["binf"], n["afin"]], [n["use"]]),
            helper.make_node("Equal", [a, zero_name], [n["zero_a"]]),
            helper.make_node("Greater", [a, zero_name], [n["apos"]]),
            helper.make_node("Greater", [b, zero_name], [n["bpos"]]),
            # Not(Xor), not Equal: TVM 0.27 emits a float compare for Equal on bools.
            helper.make_node("Xor", [n["apos"], n["bpos"]], [n["differ"]]),
            helper.make_node("Not", [n["differ"]], [n["same"]]),
            helper.make_node("Or", [n["zero_a"], n["same"]], [n["keep"]]),
            helper.make_node("Where", [n["keep"], a, b], [n["atinf"]]),
            helper.make_node("Where", [n["use"], n["atinf"], n["mod"]], list(node.output))]


def constant_as_tensor(node, info):
    """Constant with value_float(s) / value_int(s): TVM reads only the ``value`` attribute
    ("no value in Constant", 29 node-suite cases)."""
    if not node.attribute or node.attribute[0].name in ("value", "sparse_value") or \
            node.attribute[0].name.startswith("value_string"):
        return None
    value = info.constants.get(node.output[0])
    if value is None:
        return None
    return [helper.make_node("Constant", [], list(node.output),
                             value=numpy_helper.from_array(value))]


def mixed_type_pow(node, info):
    """Pow with operands of different types, or integers only: TVM requires one float type.
    Computed in float64 and cast back to the base's type, as the spec's output type is X's."""
    x, y = node.input
    tx, ty = _np_dtype(info, x), _np_dtype(info, y)
    if tx is None or ty is None or (tx == ty and np.dtype(tx).kind == "f"):
        return None
    names = [info.fresh(h) for h in ("x64", "y64", "pow64")]
    return [helper.make_node("Cast", [x], [names[0]], to=TensorProto.DOUBLE),
            helper.make_node("Cast", [y], [names[1]], to=TensorProto.DOUBLE),
            helper.make_node("Pow", [names[0], names[1]], [names[2]]),
            helper.make_node("Cast", [names[2]], list(node.output),
                             to=helper.np_dtype_to_tensor_dtype(np.dtype(tx)))]


def hyperbolic(node, info):
    """Cosh / Sinh from Exp: LLVM has no intrinsic for them ("unknown intrinsic")."""
    x = node.input[0]
    names = [info.fresh(h) for h in ("ep", "neg", "en", "sum")]
    half_name, half = _const(info, 0.5, _np_dtype(info, x) or np.float32, "half")
    combine = "Add" if node.op_type == "Cosh" else "Sub"
    return [half, helper.make_node("Exp", [x], [names[0]]),
            helper.make_node("Neg", [x], [names[1]]),
            helper.make_node("Exp", [names[1]], [names[2]]),
            helper.make_node(combine, [names[0], names[2]], [names[3]]),
            helper.make_node("Mul", [names[3], half_name], list(node.output))]


def bool_extremum(node, info):
    """ReduceMax/ReduceMin of bool (any/all) through uint8: TVM has no bool min/max value
    ("Cannot decide min_value for type bool")."""
    if info.elem_type(node.input[0]) != TensorProto.BOOL:
        return None
    return _computed_in(node, info, TensorProto.UINT8, TensorProto.BOOL)


def _computed_in(node, info, wide: int, back: int) -> list:
    """``node`` on its first input cast to ``wide``, its first output cast back to ``back``."""
    wide_in, wide_out = info.fresh("wide_in"), info.fresh("wide_out")
    inner = onnx.NodeProto()
    inner.CopyFrom(node)
    inner.input[0], inner.output[0] = wide_in, wide_out
    return [helper.make_node("Cast", [node.input[0]], [wide_in], to=wide), inner,
            helper.make_node("Cast", [wide_out], [node.output[0]], to=back)]


def resize_mapping_check(node, info):
    """Refuses constant Resize arguments TVM 0.27 maps wrongly (no rewrite: returns None).

    TVM maps output to input coordinates with in/out in float32, ONNX with 1/scale: constant
    scales that give fractional output sizes (0.6 x 4 = 2.4) map differently, and nearest
    resizing where an output pixel falls exactly halfway between two input pixels (2 -> 7)
    comes out a hair off and picks the other one. Both are checked exactly here; run-time
    sizes and scales are checked by onnx_runtime_params."""
    shape = info.shape(node.input[0])
    if not shape or None in shape:
        return None
    scales = _constant_input(node, info, 2)
    sizes = _constant_input(node, info, 3)
    if scales is not None and scales.size:
        exact = [float(s) * d for s, d in zip(scales, shape)]
        if any(e != int(e) for e in exact):
            raise UnsupportedModelError(
                f"Resize node {node.name!r}: scales {scales.tolist()} on shape {shape} give "
                "fractional output sizes, which TVM maps differently from ONNX; not supported")
        sizes = np.array(exact, np.int64)
    mode = node_attrs(node).get("mode", b"nearest")
    if sizes is not None and sizes.size and mode in (b"nearest", "nearest"):
        coordinate = node_attrs(node).get("coordinate_transformation_mode", b"half_pixel")
        for n_in, n_out in zip(shape, sizes.tolist()):
            if n_out and _halfway_tie(n_in, int(n_out), coordinate):
                raise UnsupportedModelError(
                    f"Resize node {node.name!r}: nearest resizing {n_in} -> {n_out} puts "
                    "output pixels exactly halfway between input pixels, where TVM 0.27 "
                    "rounds the wrong way; not supported")
    return None


def _constant_input(node, info, k: int):
    if len(node.input) > k and node.input[k] and node.input[k] in info.constants:
        return np.asarray(info.constants[node.input[k]])
    return None


def _halfway_tie(n_in: int, n_out: int, coordinate) -> bool:
    """Whether some output pixel maps exactly to an input half-integer (x.5), in exact
    arithmetic, while TVM's float32 ratio is inexact (its denominator is not a power of two:
    with 4 -> 2 the ties are computed exactly and come out right)."""
    if coordinate in (b"align_corners", "align_corners"):
        if n_out < 2:
            return False
        num, den = n_in - 1, n_out - 1
        ties = any((2 * x * num) % (2 * den) == den for x in range(n_out))
    elif coordinate in (b"asymmetric", "asymmetric"):
        num, den = n_in, n_out
        ties = any((2 * x * num) % (2 * den) == den for x in range(n_out))
    elif coordinate in (b"tf_half_pixel_for_nn", "tf_half_pixel_for_nn"):
        num, den = n_in, n_out
        ties = any(((2 * x + 1) * num) % (2 * den) == den for x in range(n_out))
    else:  # half_pixel, pytorch_half_pixel: (x + 0.5) * in/out - 0.5 == k + 0.5
        num, den = n_in, n_out
        ties = any(((2 * x + 1) * num) % (2 * den) == 0 for x in range(n_out))
    reduced = den // math.gcd(num, den) if num else 1
    return ties and reduced & (reduced - 1) != 0


def half_via_float32(node, info):
    """The op on float16/bfloat16 computed as Cast(float32) -> op -> Cast back: TVM's
    converter (Elu, also inside Celu's function body) mixes float32 constants into the
    half-precision math and fails ("Binary operators must have the same datatype")."""
    elem = info.elem_type(node.input[0])
    if elem not in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        return None
    return _computed_in(node, info, TensorProto.FLOAT, elem)


def lp_normalization(node, info):
    """LpNormalization (no TVM converter): x / ||x||_p along ``axis`` (p 1 or 2), 0 where the
    norm is 0, as onnx's reference defines it."""
    attrs = node_attrs(node)
    x, p = node.input[0], attrs.get("p", 2)
    if p not in (1, 2):
        raise UnsupportedModelError(f"LpNormalization node {node.name!r}: p={p} (only 1 and 2 "
                                    "exist in the spec)")
    rank = len(info.shape(x) or [])
    axis = attrs.get("axis", -1) % rank if rank else attrs.get("axis", -1)
    reduce_op = "ReduceL1" if p == 1 else "ReduceL2"
    norm, zero, ratio = info.fresh("norm"), info.fresh("norm_is_zero"), info.fresh("ratio")
    if info.opset >= 18:
        axes_name, axes_node = _const(info, [axis], np.int64, "axes")
        nodes = [axes_node, helper.make_node(reduce_op, [x, axes_name], [norm], keepdims=1)]
    else:
        nodes = [helper.make_node(reduce_op, [x], [norm], axes=[axis], keepdims=1)]
    zero_name, zero_const = _const(info, 0, _np_dtype(info, x) or np.float32, "zero")
    return nodes + [zero_const, helper.make_node("Equal", [norm, zero_name], [zero]),
                    helper.make_node("Div", [x, norm], [ratio]),
                    helper.make_node("Where", [zero, zero_name, ratio], list(node.output))]


REWRITES: dict[str, Rewrite] = {
    "DFT": dft,
    "LpNormalization": lp_normalization,
    "Elu": half_via_float32,
    "Resize": resize_mapping_check,
    "ReduceMax": bool_extremum,
    "ReduceMin": bool_extremum,
    "Constant": constant_as_tensor,
    "Pow": mixed_type_pow,
    "Cosh": hyperbolic,
    "Sinh": hyperbolic,
    "If": if_to_where,
    "Scan": unroll_scan,
    "LSTM": expand_recurrent,
    "GRU": expand_recurrent,
    "RNN": expand_recurrent,
    "Mod": float_mod_by_infinity,
    "LayerNormalization": layer_norm_stats,
    "Dropout": dropout_at_inference,
    "Conv": conv_auto_pad,
    "IsInf": isinf_directions,
    "Mish": stable_mish,
    "Softplus": stable_softplus,
    "ConvTranspose": conv_transpose_output_shape,
    "Expand": bidirectional_expand,
    "BitShift": bitshift_out_of_range,
}


def apply_rewrites(model: onnx.ModelProto, info: GraphInfo) -> tuple[onnx.ModelProto, dict]:
    """A copy of ``model`` with every applicable rewrite done; returns (model, {op: count}).
    ``model`` itself when none applies (a copy holds every weight again)."""
    counts: dict[str, int] = {}
    nodes = _rewrite_nodes(list(model.graph.node), info, counts)
    if not counts:
        return model, counts
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, counts


def _rewrite_nodes(nodes: list, info: GraphInfo, counts: dict) -> list:
    result = []
    for node in nodes:
        rewrite = REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        replaced = rewrite(node, info) if rewrite else None
        if replaced is None:
            result.append(node)
            continue
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
        result.extend(replaced)
    return result

"""RealizeInt8: turn quantize/dequantize-marked contractions into int8 kernels.

Runs right after AnnotateInt8 (quantize phase). Matches
    conv2d | matmul (dequantize(xq: uint8, sx, zx), dequantize(Wq: int8 constant, sw, 0))
optionally followed by ``add(_, bias)`` with a per-output-channel constant bias, and emits
    acc  = int8 kernel(xq, prepacked Wq)                        int32, dot_kernels.py
    y    = float32(acc) * (sx * sw) + offset                    per output channel
where the float32 ``offset`` = bias - zx * sum(Wq) * sx * sw holds the bias and the
activation zero point's correction: one multiply-add per output (LLVM contracts the two),
where an int32 offset added before the conversion cost an integer add besides. float32(acc)
is exact below 2^24; the product and the offset are rounded once each, an error of ~10^-7 of
the accumulator's magnitude, far below a step of the next layer's quantization. When sx and
zx are computed at run time (int8-dynamic matmuls) the correction is zx * sum(Wq) at run time
and the bias is added in float32. Only ``y`` is float32, and FuseOps puts it in the kernel's
epilogue along with what follows (ReLU, residual add) and the next site's quantize (which
FoldIntoQuantize merges with the multiply-add): between int8 kernels only uint8 tensors
travel, no dequantize/quantize round trip.
The weights are packed at compile time into the block layout the dot-product instruction reads
(dot_kernels.pack_*). Unmatched dequantize calls stay (they compute correctly, in float32);
the dead ones are removed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .. import dot_kernels
from ..frontends.relax_shapes import static_shape
from ..passes.layout.prepack_weights import packed_call
from ..relax_walk import mutate_functions


@dataclass(frozen=True)
class _Int8Site:
    kind: str                 # "conv2d" | "matmul"
    call: relax.Call
    xq: relax.Expr
    x_scale: float | relax.Expr   # an expression when measured per run
    x_zero: int | relax.Expr
    wq: np.ndarray            # int8, HWIO or [K, N]
    w_scale: np.ndarray       # float32 per output channel


def _const_value(expr, lookup):
    expr = lookup(expr) if isinstance(expr, relax.Var) and lookup(expr) is not None else expr
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _dequantize_of(expr, lookup):
    bound = lookup(expr) if isinstance(expr, relax.Var) else None
    if isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op) and \
            bound.op.name == "relax.dequantize":
        return bound
    return None


def _match(call: relax.Call, lookup) -> _Int8Site | None:
    """The int8 site ``call`` is (a conv2d/matmul of two dequantize calls), or None."""
    kind = _contraction_kind(call)
    if kind is None:
        return None
    x, w = (_dequantize_of(a, lookup) for a in call.args)
    if x is None or w is None or x.args[0].ty.dtype != "uint8":
        return None
    activation = _activation_params(x, kind, lookup)
    weight = _weight_params(w, kind, lookup)
    if activation is None or weight is None:
        return None
    return _Int8Site(kind, call, x.args[0], *activation, *weight)


def _contraction_kind(call) -> str | None:
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    kind = {"relax.nn.conv2d": "conv2d", "relax.matmul": "matmul"}.get(call.op.name)
    if kind == "conv2d" and int(call.attrs.groups) > 1:
        return None  # no int8 kernel for grouped convolutions (contraction_sites.py)
    return kind


def _activation_params(x: relax.Call, kind: str, lookup):
    """(scale, zero point) of the activation's dequantize: numbers when constant, the scalar
    expressions when measured per run (matmuls only: a conv pads with the zero point)."""
    sx, zx = _const_value(x.args[1], lookup), _const_value(x.args[2], lookup)
    if sx is not None and zx is not None:
        return (float(sx), int(zx)) if sx.size == 1 and zx.size == 1 else None
    if kind != "matmul" or static_shape(x.args[1]) != [] or static_shape(x.args[2]) != []:
        return None
    return x.args[1], x.args[2]


def _weight_params(w: relax.Call, kind: str, lookup):
    """(int8 weight, float32 scale per output channel) of a constant weight's dequantize,
    quantized symmetrically along its last (output-channel) axis."""
    wq, sw, zw = (_const_value(a, lookup) for a in w.args)
    if any(v is None for v in (wq, sw, zw)) or wq.dtype != np.int8 or np.any(zw != 0):
        return None
    channels = wq.shape[-1]
    if wq.ndim != (4 if kind == "conv2d" else 2) or int(w.attrs.axis) % wq.ndim != wq.ndim - 1 \
            or sw.size not in (1, channels):
        return None
    return wq, np.broadcast_to(sw.astype(np.float32), (channels,)).copy()


def _channel_bias(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """``value`` as a per-output-channel vector if it broadcasts only along the last axis."""
    if value is None or value.ndim > rank or value.dtype != np.float32:
        return None
    if any(d != 1 for d in value.shape[:-1]) or value.shape[-1:] not in ((channels,), (1,)):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float32)


@relax.expr_functor.mutator
class _Realizer(relax.PyExprMutator):
    def __init__(self, mod, values, biased):
        super().__init__(mod)
        self.values = values        # var -> value in the function as it was (before rewrite)
        self.biased = biased        # add binding var -> (site var, bias vector)
        self.deferred = {v for v, _ in biased.values()}

    def visit_var_binding_(self, binding):
        if binding.var in self.deferred:
            return  # emitted with its bias at the add (its only user)
        if binding.var in self.biased:
            site_var, bias = self.biased[binding.var]
            self._emit(binding.var, _match(self.values[site_var], self.values.get), bias)
            return
        site = _match(binding.value, self.values.get)
        if site is None:
            super().visit_var_binding_(binding)
            return
        self._emit(binding.var, site, None)

    def _emit(self, var, site: _Int8Site, bias):
        if isinstance(site.x_scale, relax.Expr):
            self._emit_dynamic(var, site, bias)
            return
        scale = (site.x_scale * site.w_scale).astype(np.float32)
        correction = -site.x_zero * site.wq.reshape(-1, site.wq.shape[-1]).astype(np.int64).sum(0)
        offset = correction * scale.astype(np.float64)
        if bias is not None:
            offset = offset + bias.astype(np.float64)
        acc = self.builder_.emit_te(*_kernel(site, self.visit_expr(site.xq)),
                                    primfunc_name_hint=f"{site.kind}_int8")
        y = relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale))
        self._bind(var, relax.op.add(self.builder_.emit(y), relax.const(offset.astype(np.float32))))

    def _emit_dynamic(self, var, site: _Int8Site, bias):
        """float32(acc - zx * sum(Wq)) * sx * sw (+ bias), with sx and zx of this run."""
        op = relax.op
        sums = site.wq.reshape(-1, site.wq.shape[-1]).astype(np.int64).sum(0).astype(np.int32)
        zero, scale = self.visit_expr(site.x_zero), self.visit_expr(site.x_scale)
        acc = self.builder_.emit_te(*_kernel(site, self.visit_expr(site.xq)),
                                    primfunc_name_hint=f"{site.kind}_int8")
        y = op.subtract(acc, op.multiply(zero, relax.const(sums)))
        y = op.multiply(op.multiply(op.astype(y, "float32"), scale), relax.const(site.w_scale))
        if bias is not None:
            y = op.add(self.builder_.emit(y), relax.const(bias))
        self._bind(var, y)

    def _bind(self, var, value):
        emit = self.builder_.emit if isinstance(var, relax.DataflowVar) else \
            self.builder_.emit_output
        self.set_var_remap(var, emit(value, var.name))


def _kernel(site: _Int8Site, xq):
    """(te function, args...) for emit_te. A matmul's K padding meets zero weights, so any pad
    value will do there; a conv pads with the zero point (the quantized 0.0)."""
    zero = site.x_zero if isinstance(site.x_zero, int) else 0
    return packed_call(site.call, site.wq, xq, dot_kernels.INT8, zero)


def _biased_sites(func: relax.Function) -> dict:
    """add bindings ``add(site, constant bias)`` whose site has no other user -> (site var,
    bias vector)."""
    values = relax.analysis.get_var2val(func)
    out = {}
    for block in getattr(func.body, "blocks", []):
        if not isinstance(block, relax.DataflowBlock):
            continue
        users = relax.analysis.udchain(block)
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                    and value.op.name == "relax.add"):
                continue
            site_var, const = value.args
            if isinstance(const, relax.DataflowVar):
                site_var, const = const, site_var
            if not isinstance(site_var, relax.DataflowVar) or len(users.get(site_var, [])) != 1:
                continue
            site = _match(values.get(site_var), values.get)
            if site is None:
                continue
            bias = _channel_bias(const.value.numpy() if isinstance(const, tvm.ir.GenericConst)
                                 else None, site.wq.shape[-1], len(static_shape(site_var)))
            if bias is not None:
                out[binding.var] = (site_var, bias)
    return out


@tvm.transform.module_pass(opt_level=0, name="RealizeInt8")
class RealizeInt8:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not any(isinstance(f, relax.Function) for _, f in mod.functions_items()):
            return mod
        main = mod["main"]
        realizer = _Realizer(mod, relax.analysis.get_var2val(main), _biased_sites(main))
        mod = mutate_functions(mod, realizer)
        return relax.transform.DeadCodeElimination()(mod)

"""Decoders that generate: a model exported "with past" (it takes the earlier tokens' keys
and values and returns them extended by a ``Concat``) compiled to two more entries that keep
the keys and values in fixed-size cache tensors, written in place.

``prefill(ids, mask, positions, cache...)`` runs a prompt of any length from position 0 and
writes its keys and values to the front of each cache; ``decode(ids, mask, positions,
cache..., cache_position)`` runs one token, writes its key and value at ``cache_position``
and attends over the whole cache, which the mask (ones up to and including the new token,
zeros after) limits to the real tokens. Both return the logits and the caches (the same
tensors they took): nothing is copied from call to call, and the decode step's shapes are
all static (the cache's capacity), so its kernels get static schedules.

How: the past length ``P``, the new-token count ``S`` and the mask's total length ``T`` are
symbolic dims of the export. ``prefill`` binds ``P = 0``, ``T = S``; ``decode`` binds
``S = 1``, ``P = capacity - 1``, ``T = capacity``; then each ``present = concat(past, new)``
becomes an in-place write of ``new`` into the cache (``call_tir_inplace``), and the cache,
not the concatenation, is what attention reads. The symbolic ``main`` stays in the library.

The rewrite relies on the mask: an export that derives positions from the past length, or
ignores the mask, would read the cache's unused tail. ``verify`` runs prefill and decode
against ``main`` at compile time and refuses a library whose logits differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, tirx

from aotc.errors import UnsupportedModelError
from aotc.runtime.signature import ModelSignature

from .tvmscript import parsed

# Keys are padded to whole AVX-512 registers by FuseAttention; a capacity that is a multiple
# of this needs no padding copies.
CAPACITY_MULTIPLE = 16
POSITION_INPUT = "cache_position"
_CONCAT = tvm.ir.Op.get("relax.concat")


@dataclass(frozen=True)
class Roles:
    """Which inputs and dims of the export play which part."""
    ids: str
    mask: str
    positions: str | None
    caches: tuple[tuple[str, str], ...]  # (past input, present output)
    axis: int  # the sequence axis of the caches
    past: str  # symbolic dim names: past length, new tokens, mask length
    new: str
    total: str
    batch: tuple[str, ...]


def round_capacity(capacity: int) -> int:
    return -(-capacity // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE


def find_roles(mod: tvm.IRModule, signature: ModelSignature, source: str) -> Roles:
    """The export's roles, or an UnsupportedModelError that says what is missing."""
    func = mod["main"]
    params = {spec.name: param for spec, param in zip(signature.inputs, func.params)}
    concats = _concats_of_params(func)
    outputs = _output_vars(func)
    caches, axis = [], None
    by_var = {v: name for name, v in params.items()}
    for index, spec in enumerate(signature.outputs):
        bound = concats.get(outputs[index]) if index < len(outputs) else None
        if bound is None:
            continue
        past_name = by_var.get(bound[0])
        if past_name is None:
            continue
        caches.append((past_name, spec.name))
        if axis is not None and axis != bound[1]:
            raise UnsupportedModelError(f"{source}: the caches grow along different axes")
        axis = bound[1]
    if not caches:
        raise UnsupportedModelError(
            f"{source}: not a decoder exported with past keys and values: no output is a "
            "Concat of an input with new values (inputs past_key_values.*, outputs present.*)")
    cache_inputs = {past for past, _ in caches}
    others = [spec for spec in signature.inputs if spec.name not in cache_inputs]
    mask = next((s for s in others if "mask" in s.name.lower()), None)
    positions = next((s for s in others if "position" in s.name.lower()), None)
    ids = next((s for s in others if s is not mask and s is not positions
                and s.dtype.startswith("int")), None)
    if mask is None or ids is None:
        raise UnsupportedModelError(
            f"{source}: a decoder with past needs token ids and an attention mask among its "
            f"inputs to generate; it has {[s.name for s in others]}")
    unknown = [s.name for s in others if s not in (mask, positions, ids)]
    if unknown:
        raise UnsupportedModelError(f"{source}: inputs {unknown} have no part in generation "
                                    "(token ids, attention mask, position ids, past values)")
    past_spec = next(s for s in signature.inputs if s.name == caches[0][0])
    past, new, total = past_spec.shape[axis], ids.shape[-1], mask.shape[-1]
    if not all(isinstance(d, str) for d in (past, new, total)):
        raise UnsupportedModelError(f"{source}: the past length, token count and mask length "
                                    f"must be dynamic axes; they are {past}, {new}, {total}")
    roles_dims = {past, new, total}
    batch = set()
    for spec in signature.inputs:
        for k, dim in enumerate(spec.shape):
            if isinstance(dim, str) and dim not in roles_dims:
                if k != 0:
                    raise UnsupportedModelError(f"{source}: dynamic axis {dim!r} of input "
                                                f"{spec.name!r} has no part in generation")
                batch.add(dim)
    return Roles(ids.name, mask.name, positions.name if positions else None, tuple(caches),
                 axis, past, new, total, tuple(sorted(batch)))


def _aliases(func: relax.Function) -> dict:
    """var -> the expression it stands for, through var-to-var bindings and one-input
    Concats (exporters emit both)."""
    alias: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if (isinstance(value, relax.Call) and value.op == _CONCAT
                    and isinstance(value.args[0], relax.Tuple) and len(value.args[0].fields) == 1):
                value = value.args[0].fields[0]
            if isinstance(value, relax.Var):
                alias[binding.var] = alias.get(value, value)
            elif isinstance(value, relax.Tuple):
                alias[binding.var] = value
    return alias


def _output_vars(func: relax.Function) -> list:
    body = func.body.body
    body = _aliases(func).get(body, body)
    return list(body.fields) if isinstance(body, relax.Tuple) else [body]


def _concats_of_params(func: relax.Function) -> dict:
    """bound var -> (the param concatenated first, axis) for ``concat((param, x))``."""
    params = set(func.params)
    alias = _aliases(func)
    found = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if (isinstance(value, relax.Call) and value.op == _CONCAT
                    and isinstance(value.args[0], relax.Tuple)
                    and len(value.args[0].fields) == 2):
                first = value.args[0].fields[0]
                first = alias.get(first, first)
                if first in params:
                    ndim = len(first.ty.shape.values)
                    found[binding.var] = (first, int(value.attrs.axis) % ndim)
    for var_id, value in alias.items():
        if isinstance(value, relax.Var) and value in found:
            found[var_id] = found[value]
    return found


def _write_kernel(shape: list, axis: int, dtype: str, capacity: int, with_position: bool):
    """cache[..., position + i, ...] = new[..., i, ...] along ``axis``; a position past the
    capacity raises (the runtime checks first; this keeps the write in bounds regardless)."""
    rank = len(shape)
    loop = [f"i{k}" for k in range(rank)]
    cache_dims = [str(capacity) if k == axis else str(d) for k, d in enumerate(shape)]
    new_dims = ["n" if k == axis else str(d) for k, d in enumerate(shape)]
    start = "position[0]" if with_position else "T.int64(0)"
    at = [f"{start} + {v}" if k == axis else v for k, v in enumerate(loop)]
    args = "var_cache: T.handle, var_new: T.handle" + (
        ", var_position: T.handle" if with_position else "")
    lines = ["@T.prim_func(private=True, s_tir=True)", f"def kv_write({args}):",
             "    T.func_attr({'op_pattern': 8, 'tirx.is_scheduled': True, "
             "'tirx.noalias': True})",
             "    n = T.int64()",
             f"    cache = T.match_buffer(var_cache, ({', '.join(cache_dims)},), \"{dtype}\")",
             f"    new = T.match_buffer(var_new, ({', '.join(new_dims)},), \"{dtype}\")"]
    if with_position:
        lines.append("    position = T.match_buffer(var_position, (1,), \"int64\")")
    lines += [f"    for {', '.join(loop)} in T.grid({', '.join(new_dims)}):",
              "        with T.sblock(\"write\"):",
              f"            assert {start} >= T.int64(0) and {start} + n <= T.int64({capacity}), "
              "(\"ValueError\", [\"KV cache: writing past its capacity\"])",
              f"            cache[{', '.join(at)}] = new[{', '.join(loop)}]"]
    source = "\n".join(lines).replace("(,)", "()")
    return parsed(source)


@relax.expr_functor.mutator
class _InPlace(relax.PyExprMutator):
    """Each ``concat((past, new))`` of a cache becomes a write of ``new`` into its cache.
    decode (with a position): what attention reads is the written cache. prefill: attention
    reads ``new`` (there is no past), and the written cache is the output."""

    def __init__(self, mod, writes: dict, position, alias: dict, last_row_of=None):
        super().__init__(mod)
        self.writes, self.position = writes, position  # past param -> (cache, kernel)
        self.alias = alias
        self.written: dict = {}  # prefill: present var -> the written cache
        self.last_row_of = last_row_of  # prefill: the logits, computed for the last token

    def _last_row(self, value):
        """``matmul(x, w)`` over ``x``'s last row only (generation reads no other), or None
        for any other op."""
        if not (isinstance(value, relax.Call) and value.op == tvm.ir.Op.get("relax.matmul")):
            return None
        x = self.visit_expr(value.args[0])
        shape = getattr(x.ty, "shape", None)
        if shape is None or len(shape.values) < 2:
            return None
        rows, axis = shape.values[-2], len(shape.values) - 2
        last = self.builder_.emit(relax.op.strided_slice(x, axes=[axis], begin=[rows - 1],
                                                         end=[rows], assume_inbound=True))
        return relax.op.matmul(last, self.visit_expr(value.args[1]), value.attrs.out_dtype)

    def _hit(self, value):
        if not (isinstance(value, relax.Call) and value.op == _CONCAT
                and isinstance(value.args[0], relax.Tuple) and len(value.args[0].fields) == 2):
            return None
        first = value.args[0].fields[0]
        first = self.alias.get(first, first)
        if first not in self.writes:
            return None
        return (*self.writes[first], value.args[0].fields[1])

    def visit_var_binding_(self, binding):
        if self.last_row_of is not None and binding.var.same_as(self.last_row_of):
            last = self._last_row(binding.value)
            if last is not None:
                self.set_var_remap(binding.var, self.builder_.emit(last))
                return None
        hit = self._hit(binding.value)
        if hit is None or self.position is not None:
            return super().visit_var_binding_(binding)
        cache, kernel, new = hit
        new = self.visit_expr(new)
        self.written[binding.var] = self.builder_.emit(
            relax.call_tir_inplace(kernel, [cache, new], [0], cache.ty))
        self.set_var_remap(binding.var, new)
        return None

    def visit_call_(self, call):
        hit = self._hit(call)
        if hit is not None and self.position is not None:
            cache, kernel, new = hit
            return relax.call_tir_inplace(kernel, [cache, self.visit_expr(new), self.position],
                                          [0], cache.ty)
        return super().visit_call_(call)

    def visit_tuple_(self, tup):
        if any(self.alias.get(f, f) in self.written for f in tup.fields):
            return relax.Tuple([self.written[self.alias.get(f, f)]
                                if self.alias.get(f, f) in self.written else self.visit_expr(f)
                                for f in tup.fields])
        return super().visit_tuple_(tup)


def entries(mod: tvm.IRModule, signature: ModelSignature, roles: Roles,
            capacity: int) -> dict[str, tvm.IRModule]:
    """{"prefill": module, "decode": module}, each with its entry as ``main``."""
    return {"prefill": _entry(mod, signature, roles, capacity, decode=False),
            "decode": _entry(mod, signature, roles, capacity, decode=True)}


def _entry(mod, signature, roles: Roles, capacity: int, decode: bool) -> tvm.IRModule:
    func = mod["main"]
    batch = {name: 1 for name in roles.batch}
    if decode:
        binding = {roles.new: 1, roles.past: capacity - 1, roles.total: capacity, **batch}
    else:
        binding = {roles.past: 0, **batch}
    func = func.bind_symbolic_vars(binding)
    if not decode:
        new_var = _dim_var(func, signature, roles.ids, roles.new)
        func = func.bind_symbolic_vars({roles.total: new_var})
    names = [spec.name for spec in signature.inputs]
    params = list(func.params)
    builder = relax.BlockBuilder(tvm.IRModule({gv: f for gv, f in mod.functions_items()
                                               if gv.name_hint != "main"}))
    kernels: dict = {}
    writes, new_params = {}, []
    position = relax.Var(POSITION_INPUT, relax.TensorType((1,), "int64")) if decode else None
    for name, param in zip(names, params):
        past = dict(roles.caches).get(name)
        if past is None:
            new_params.append(param)
            continue
        shape = [int(d) for d in param.ty.shape.values]
        shape[roles.axis] = capacity
        dtype = str(param.ty.dtype)
        key = (tuple(shape), dtype)
        if key not in kernels:
            kernels[key] = builder.add_func(
                _write_kernel(shape, roles.axis, dtype, capacity, decode), "aotc_kv_write")
        cache = relax.Var(param.name, relax.TensorType(shape, dtype))
        writes[param] = (cache, kernels[key])
        new_params.append(cache)
    if decode:
        new_params.append(position)
    module = builder.get()
    alias = _aliases(func)
    logits = None
    if not decode:  # generation reads the last token's logits only
        outputs = [o.name for o in signature.outputs]
        presents = {present for _, present in roles.caches}
        index = next(k for k, name in enumerate(outputs) if name not in presents)
        logits = _output_vars(func)[index]
    body = _InPlace(module, writes, position, alias, logits).visit_expr(func.body)
    body = relax.analysis.remove_all_unused(body)
    used = relax.analysis.free_vars(body)
    stale = [p.name for p in params if p in writes and any(v.same_as(p) for v in used)]
    if stale:
        raise UnsupportedModelError(
            f"past inputs {stale} are read other than by the Concat that extends them; "
            "aotc cannot keep them in a cache")
    entry = relax.Function(new_params, body, None, func.is_pure, func.attrs)
    out = tvm.IRModule({gv: f for gv, f in module.functions_items()})
    out["main"] = entry.with_attr("global_symbol", "main")
    return out


def _dim_var(func: relax.Function, signature: ModelSignature, input_name: str, dim: str):
    """The TIR var of symbolic dim ``dim`` as it appears in input ``input_name``."""
    names = [spec.name for spec in signature.inputs]
    param = func.params[names.index(input_name)]
    for value in param.ty.shape.values:
        if isinstance(value, tirx.Var) and value.name == dim:
            return value
    raise UnsupportedModelError(f"input {input_name!r} has no dynamic axis {dim!r}")


def table(signature: ModelSignature, roles: Roles, capacity: int) -> dict:
    """What the runtime needs to generate (embedded in the library's metadata)."""
    specs = {spec.name: spec for spec in signature.inputs}
    caches = []
    for past, present in roles.caches:
        shape = [1 if isinstance(d, str) else d for d in specs[past].shape]
        shape[roles.axis] = capacity
        caches.append({"input": past, "output": present, "shape": shape,
                       "dtype": specs[past].dtype})
    logits = next(o.name for o in signature.outputs
                  if o.name not in {present for _, present in roles.caches})
    return {"capacity": capacity, "inputs": [spec.name for spec in signature.inputs],
            "past_dim": roles.past,
            "ids": roles.ids, "mask": roles.mask,
            "positions": roles.positions, "caches": caches, "axis": roles.axis,
            "logits": logits, "entries": {"prefill": "prefill", "decode": "decode"}}


# How far the cache entries' logits may be from main's, as a share of main's largest logit, in
# a bf16 or fp16 build. Its entries need not round alike: a prefill of 5 rows, a decode of 1
# and main's symbolic rows can take different kernels (on AMX: tiles, or vector kernels
# below 7 rows), whose products round operands to bf16 at different points. The export
# mistakes this check is for (positions derived from the past length, a mask ignored) move
# the logits by their own size.
REDUCED_PRECISION_SHARE = 0.02


def verify(path, signature: ModelSignature, generation: dict, precision: str = "fp32",
           rtol=1e-3, atol=1e-4) -> None:
    """Prefill 5 tokens and decode 2 with the library at ``path`` against its ``main`` (past
    tensors of the real lengths); refuse the library when their logits differ: by more than
    ``rtol``/``atol`` in float32, by more than REDUCED_PRECISION_SHARE of the largest logit in
    a bf16 or fp16 build."""
    from aotc.runtime import load
    from aotc.runtime.generate import with_past_feed
    model = load(path)
    rng = np.random.default_rng(0)
    vocabulary = next(o.shape[-1] for o in signature.outputs
                      if o.name == generation["logits"])
    tokens = rng.integers(0, vocabulary if isinstance(vocabulary, int) else 2, 7)
    prompt = 5
    got = model.generation_logits(tokens, prompt)
    past = {c["input"]: np.zeros([0 if k == generation["axis"] else d
                                  for k, d in enumerate(c["shape"])], c["dtype"])
            for c in generation["caches"]}
    start = 0
    for step, stop in enumerate((prompt, prompt + 1, prompt + 2)):
        values = model.run(with_past_feed(generation, tokens[start:stop], past), entry="main")
        want = values[generation["logits"]][0, -1]
        if precision != "fp32":
            rtol, atol = 0.0, REDUCED_PRECISION_SHARE * float(np.abs(want).max())
        if not np.allclose(got[step], want, rtol=rtol, atol=atol):
            raise UnsupportedModelError(
                f"KV cache: step {step}'s logits from the cache entries differ from the "
                f"model's own ({float(np.abs(got[step] - want).max()):.3g} apart); the export "
                "may derive positions from the past length or ignore the attention mask: "
                "export position_ids as an input")
        past = {c["input"]: values[c["output"]] for c in generation["caches"]}
        start = stop

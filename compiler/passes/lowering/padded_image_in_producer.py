"""PaddedImageInProducer: a kernel whose only consumer is a conv that copies its image into a
zero-padded buffer first (dot_kernels' ``PAD_BLOCK``) writes its result straight into that
padded buffer, border included, and the conv reads it in place: the copy is gone.

Why: a packed conv's tiles read their taps from a padded image ([N, H + 2, W + 2, C] for a 3x3
conv), so the conv kernel began with a pass that read the whole activation and wrote it again
with a border of zeros (VGG's 112x112x96 stage: 2.4 MB read and 2.5 MB written before every
conv there). The layer before it had just written that activation.

How: the producer's output buffer becomes a view (a ``match_buffer`` of strided region) of a
parameter of the padded shape, at the pad's offsets, so that its body stores where it stored
before, now inside the border; loop nests appended to it store the pad value into the border
rows and columns. The consumer takes the padded buffer as its input in place of the image, its
pad block's loop nest removed and the padded buffer it allocated replaced by that input. The
values the conv reads are the ones its pad block wrote, bit for bit.

Which: a consumer whose top-level loop nest holds only its ``PAD_BLOCK``, storing
``if_then_else(inside, image[i - top, j - left, ...], value)`` with constant offsets into a
buffer of the image's rank and channels (a spatial pad only: a channel pad to the packing
group would need a fill inside every pixel), ``inside`` true on the image's box and false
just outside it on every axis (evaluated at the box's edges), where the image is a parameter
no other block reads; a producer that is a ``call_tir`` nothing else reads, of a static
output shape without strides. Kernels shared with other call sites are copied
(``<name>_padded_out``, ``<name>_padded_in``), the other sites keep the originals.

Where: the schedule phase's end, after PaddedRowsInProducer: tuning sees and records the
kernels of the lowered module, unchanged; the appended border stores are a few rows and
columns."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.sym.analyzer import Analyzer

from ...default_schedules.cpu_blocks import renew_definitions
from ...dot_kernels import PAD_BLOCK
from ...frontends.relax_shapes import static_shape
from ...relax_walk import mutate_functions, value_uses
from .producer_rewrites import (
    call_tir_parts,
    fill,
    renamed,
    root_block,
    statements,
    static_buffer_shape,
    with_root_block,
    with_shape,
)


class _Pad:
    """What a consumer's pad block does: the parameter index of the image it reads, the
    padded buffer it writes (an allocation of the kernel's root block), its shape, the offset
    of the image inside it on every axis and the value of the border; ``nest``: the top-level
    statement that holds the block, to be removed."""

    def __init__(self, param: int, buffer, shape: list[int], offsets: list[int], value,
                 nest: tirx.Stmt):
        self.param, self.buffer, self.shape = param, buffer, shape
        self.offsets, self.value, self.nest = offsets, value, nest


def _blocks_in(stmt: tirx.Stmt) -> list:
    found: list = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, found.append))
    return found


def _reads_of(blocks, buffer) -> int:
    return sum(1 for block in blocks for region in block.reads if region.source.same_as(buffer))


def find_pad(func: tirx.PrimFunc) -> _Pad | None:
    """The zero-padding copy at the start of ``func`` that PaddedImageInProducer can drop, or
    None (see the module docstring for what qualifies)."""
    root = root_block(func)
    if root is None or not isinstance(root.body, tirx.SeqStmt):
        return None
    everything = _blocks_in(root.body)
    for nest in root.body.seq:
        blocks = _blocks_in(nest)
        if len(blocks) != 1 or blocks[0].name_hint != PAD_BLOCK:
            continue
        block = blocks[0]
        store = block.body
        if not isinstance(store, tirx.BufferStore) or len(block.writes) != 1:
            return None
        value = store.value
        if not (isinstance(value, tvm.ir.expr.Call) and value.op.name == "prim.if_then_else"):
            return None
        _, load, fill = value.args
        if not isinstance(load, tvm.ir.TensorLoad) or not isinstance(fill, (tirx.IntImm,
                                                                         tirx.FloatImm)):
            return None
        params = [k for k, p in enumerate(func.params) if p.same_as(load.source)]
        padded = store.buffer
        if len(params) != 1 or not any(b.same_as(padded) for b in root.alloc_buffers) or \
                _reads_of(everything, load.source) != 1:
            return None
        shape = static_buffer_shape(padded)
        image = static_buffer_shape(load.source)
        iters = [iv.var for iv in block.iter_vars]
        # every element stored once: an iteration variable an axis, or 0 on a unit axis
        if shape is None or image is None or len(shape) != len(image) or \
                len(store.indices) != len(shape) or len(load.indices) != len(shape) or \
                any(not (any(index.same_as(var) for var in iters) or
                         (isinstance(index, tirx.IntImm) and int(index) == 0 and extent == 1))
                    for index, extent in zip(store.indices, shape)):
            return None
        analyzer = Analyzer()
        offsets = []
        for index, read in zip(store.indices, load.indices):
            offset = analyzer.simplify(index - read)
            if not isinstance(offset, tirx.IntImm):
                return None
            offsets.append(int(offset))
        # a spatial pad: the image whole inside, no axis but the spatial ones padded
        if shape[-1] != image[-1] or offsets[-1] != 0 or shape[0] != image[0] or offsets[0] or \
                any(o < 0 or o + e > s for o, e, s in zip(offsets, image, shape)) or \
                not _selects_the_image(value.args[0], store.indices, offsets, image, shape):
            return None
        return _Pad(params[0], padded, shape, offsets, fill, nest)
    return None


def _selects_the_image(condition, indices, offsets: list[int], image: list[int],
                       shape: list[int]) -> bool:
    """Whether ``condition`` (of the pad's store indices) holds at the first and last element
    of the image on every axis and fails just outside it, the other axes inside: that it is
    the test for the image's box, so that the producer's view and the border stores write
    what the pad block wrote."""
    analyzer = Analyzer()

    def holds(axis: int, at: int) -> bool | None:
        values = {}
        for k, index in enumerate(indices):
            if isinstance(index, tirx.Var):
                values[index] = tirx.const(at if k == axis else offsets[k], index.ty)
        result = analyzer.simplify(tvm_ffi.structural_map(
            condition, (tirx.Var, lambda v: next((c for var, c in values.items()
                                                  if var.same_as(v)), v))))
        return bool(int(result)) if isinstance(result, tirx.IntImm) else None
    for axis, (o, e, s) in enumerate(zip(offsets, image, shape)):
        if holds(axis, o) is not True or holds(axis, o + e - 1) is not True:
            return False
        if (o > 0 and holds(axis, o - 1) is not False) or \
                (o + e < s and holds(axis, o + e) is not False):
            return False
    return True


def _border(out, shape: list[int], offsets: list[int], inner: list[int], value, dtype: str
            ) -> list[tirx.Stmt]:
    """Loop nests that store ``value`` into every element of ``out`` (of ``shape``) outside
    the box at ``offsets`` of extents ``inner``: for each axis, the slabs before and after the
    box, the axes before it over the box's extent (their slabs were stored already), the axes
    after it whole."""
    nests = []
    for axis in range(len(shape)):
        for start, stop in ((0, offsets[axis]),
                            (offsets[axis] + inner[axis], shape[axis])):
            if stop <= start:
                continue
            lows = [offsets[k] if k < axis else 0 for k in range(len(shape))]
            extents = [inner[k] if k < axis else shape[k] for k in range(len(shape))]
            lows[axis], extents[axis] = start, stop - start
            nests.append(fill(out, lows, extents, value.value, dtype,
                              "padded_image_border", "b"))
    return nests


def writes_into_padded(func: tirx.PrimFunc, pad: _Pad) -> tirx.PrimFunc | None:
    """``func`` (a kernel whose last parameter is its output) writing into a parameter of
    ``pad``'s padded shape: its output a view of that parameter at the pad's offsets, the rest
    of it the pad's value; None where its output shape is not static or differs from the
    image, or its strides are explicit."""
    out = func.params[-1]
    t = out.ty
    shape = static_buffer_shape(out)
    root = root_block(func)
    if shape is None or len(t.strides) or root is None or \
            len(shape) != len(pad.shape) or \
            any(o + e > s for o, e, s in zip(pad.offsets, shape, pad.shape)):
        return None
    dtype = str(t.shape[0].ty)
    padded = with_shape(out, pad.shape, dtype)
    view = tirx.Var(f"{out.name}_inside", tirx.BufferType(
        t.dtype, t.storage_scope, t.shape,
        [tirx.Var(f"s{k}", dtype) for k in range(len(shape))], tirx.Var("elem_offset", dtype),
        t.data_alignment, 1, t.layout, t.allocated_addr))
    func = renew_definitions(func, {out: view})
    root = root_block(func)
    region = padded[tuple(slice(o, o + e) for o, e in zip(pad.offsets, shape))]
    border = _border(padded, pad.shape, pad.offsets, shape, pad.value, dtype)
    return with_root_block(
        func, params=[*func.params[:-1], padded], body=[*statements(root.body), *border],
        match_buffers=[*root.match_buffers, s_tir.MatchBufferRegion(view, region)])


def reads_padded(func: tirx.PrimFunc, pad: _Pad) -> tirx.PrimFunc:
    """``func`` with its image parameter replaced by the padded buffer its pad block wrote,
    and that block's loop nest and allocation gone."""
    root = root_block(func)
    params = list(func.params)
    params[pad.param] = pad.buffer
    # fresh variables: the original stays in the module for its other call sites
    return renew_definitions(with_root_block(
        func, params=params, body=[s for s in root.body.seq if not s.same_as(pad.nest)],
        alloc_buffers=[b for b in root.alloc_buffers if not b.same_as(pad.buffer)]))


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.single_use = {v for v, n in value_uses(mod).items() if n == 1}
        self.values: dict = {}
        self.pads: dict = {}      # consumer global var name -> _Pad or None
        self.made: dict = {}      # (kind, global var name, shape, offsets) -> global var
        # a var whose binding this pass rewrote -> the value it now has: a conv reading its
        # input in place may itself write into the padded input of the next one
        self.rewritten: dict = {}

    def visit_var_binding_(self, binding):
        self.values[binding.var] = binding.value
        new = self._read_in_place(binding)
        if new is None:
            super().visit_var_binding_(binding)
            return
        self.set_var_remap(binding.var, new[0])
        self.rewritten[binding.var] = new[1]

    def _func(self, gv):
        return self.builder_.get()[gv]

    def _pad_of(self, gv) -> _Pad | None:
        if gv.name_hint not in self.pads:
            func = self._func(gv)
            self.pads[gv.name_hint] = find_pad(func) if isinstance(func, tirx.PrimFunc) \
                else None
        return self.pads[gv.name_hint]

    def _read_in_place(self, binding):
        consumer = call_tir_parts(binding.value)
        if consumer is None:
            return None
        pad = self._pad_of(consumer[0])
        if pad is None or pad.param >= len(consumer[1]):
            return None
        source = consumer[1][pad.param]
        original = self.values.get(source) if isinstance(source, relax.DataflowVar) else None
        if original is None or original not in self.single_use:
            return None
        producer = call_tir_parts(self.rewritten.get(source, original))
        if producer is None:
            return None
        func = self._func(producer[0])
        if not isinstance(func, tirx.PrimFunc) or len(func.params) != len(producer[1]) + 1 or \
                static_shape(source) is None:
            return None
        geometry = (tuple(pad.shape), tuple(pad.offsets), str(pad.value))
        key = ("out", producer[0].name_hint, *geometry)
        if key not in self.made:
            new_func = writes_into_padded(func, pad)
            if new_func is None:
                return None
            name = f"{producer[0].name_hint}_padded_out"
            self.made[key] = self.builder_.add_func(renamed(new_func, name), name)
        key_in = ("in", consumer[0].name_hint)
        if key_in not in self.made:
            name = f"{consumer[0].name_hint}_padded_in"
            new_func = renamed(reads_padded(self._func(consumer[0]), pad), name)
            self.made[key_in] = self.builder_.add_func(new_func, name)
        args = [self.visit_expr(a) for a in producer[1]]
        written = self.builder_.emit(relax.call_tir(
            self.made[key], args, relax.TensorType(pad.shape, source.ty.dtype)))
        inputs = [written if k == pad.param else self.visit_expr(a)
                  for k, a in enumerate(consumer[1])]
        value = relax.call_tir(self.made[key_in], inputs, binding.value.ty_args[0])
        return self.builder_.emit(value), value


@tvm.transform.module_pass(opt_level=0, name="PaddedImageInProducer")
class PaddedImageInProducer:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax.transform.DeadCodeElimination()(mutate_functions(mod, _Rewriter(mod)))

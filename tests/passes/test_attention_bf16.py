"""AttentionBF16 (``--precision bf16``): the attention function FuseAttention grouped becomes
four kernels, Q rounded to bf16 bits, Kt and V packed in bf16 blocks, and the bf16 attention
kernel (compiler/attention_kernels.py), which FuseOps may not fuse into. The numbers stay near
the float32 chain's (bf16 operands, float32 sums and softmax). Left alone: a head dim that is
not a multiple of 16, a target without AVX512-BF16, precision fp32."""

import numpy as np
import pytest
import tvm
from relax_helpers import (
    assert_matches,
    attention_functions,
    attention_module,
    main_ops,
)
from tvm import relax

from aotc.compiler import attention_kernels, dot_kernels
from aotc.compiler.passes.fusion import FuseAttention
from aotc.compiler.quantize import AttentionBF16

RNG = np.random.default_rng(0)
BF16_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server",
                                 "mattr": ["+avx512bf16"]})
# without AVX512-BF16, and runnable on every x86 host the tests run on (the modules are run
# in-process)
PLAIN_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})


def _fused(**kwargs) -> tvm.IRModule:
    return FuseAttention()(attention_module(**kwargs))


def _converted(before: tvm.IRModule, target=BF16_TARGET, enabled=True) -> tvm.IRModule:
    with target:
        return AttentionBF16(enabled)(before)


def _expected(before: tvm.IRModule) -> tvm.IRModule:
    """``before`` (FuseAttention's output, 32 queries and keys, a mask, scores divided by 4)
    as the pass should leave it, written out: the four kernels, the attention one opaque, and
    no grouped function."""
    params = before["main"].params
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            q, kt, v, mask = params
            qb = bb.emit_te(dot_kernels.to_bf16_bits, q, primfunc_name_hint="to_bf16")
            kp = bb.emit_te(attention_kernels.pack_keys, kt, primfunc_name_hint="pack_keys_bf16")
            vp = bb.emit_te(attention_kernels.pack_values, v,
                            primfunc_name_hint="pack_values_bf16")
            out = bb.emit_te(attention_kernels.attention, qb, kp, vp, mask, scale=4.0,
                             divide=True, nan_value=None, primfunc_name_hint="attention_bf16")
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    mod = bb.get()
    gv = mod.get_global_var("attention_bf16")
    mod[gv] = mod[gv].with_attr("op_pattern", 8)
    return mod


def _run(mod, arrays):
    with PLAIN_TARGET:
        mod = relax.transform.LegalizeOps()(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target=PLAIN_TARGET), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _arrays(mod, seq=None):
    out = []
    for index, param in enumerate(mod["main"].params):
        shape = [seq if not isinstance(d, tvm.tirx.IntImm) else int(d)
                 for d in param.ty.shape.values]
        if index == 3:
            mask = np.where(RNG.random(shape) < 0.3, -1e4, 0).astype(np.float32)
            mask[..., 0] = 0
            out.append(mask)
        else:
            out.append(RNG.standard_normal(shape).astype(np.float32))
    return out


def test_the_grouped_attention_becomes_the_four_bf16_kernels():
    before = _fused()
    assert len(attention_functions(before)) == 1
    after = _converted(before)
    tvm.ir.assert_structural_equal(after, _expected(before))
    arrays = _arrays(before)
    assert_matches(_run(after, arrays), _run(before, arrays), 0.9999, 0.02)


@pytest.mark.parametrize("kwargs", [
    {"queries": 197, "keys": 197, "scale": ("multiply", 0.125)},  # padded rows and keys
    {"safe": True, "mask": False},                                # torch's safe softmax
    {"scale": None, "width": 32},                                  # no scale, wider V
])
def test_numbers_stay_near_float32(kwargs):
    before = _fused(**kwargs)
    after = _converted(before)
    assert attention_functions(after) == [] and "attention_bf16" in [g.name_hint for g in
                                                                     after.get_global_vars()]
    arrays = _arrays(before)
    assert_matches(_run(after, arrays), _run(before, arrays), 0.9999, 0.02)


def test_a_symbolic_length_keeps_its_padding():
    before = _fused(symbolic=True)
    after = _converted(before)
    assert attention_functions(after) == []
    for seq in (1, 13, 40):
        arrays = _arrays(before, seq)
        assert_matches(_run(after, arrays), _run(before, arrays), 0.9999, 0.02)


@pytest.mark.parametrize("module, target, enabled", [
    (lambda: _fused(width=8), BF16_TARGET, True),     # V's head dim: half a block
    (lambda: _fused(depth=24), BF16_TARGET, True),    # Q's head dim
    (_fused, PLAIN_TARGET, True),                     # no vdpbf16ps
    (_fused, BF16_TARGET, False),                     # precision fp32
])
def test_left_alone(module, target, enabled):
    before = module()
    after = _converted(before, target, enabled)
    tvm.ir.assert_structural_equal(after, before)
    assert "relax.nn.softmax" not in main_ops(after)


@pytest.mark.parametrize("pack", [attention_kernels.pack_keys, attention_kernels.pack_values])
def test_the_pack_kernels_take_the_vector_schedule(pack):
    """AttentionPacks takes a pack with the head-split transpose in front of it (as FuseOps
    leaves it): the transpose inlined, the 16 lanes of each block one vector, and the numbers
    those of numpy's bf16 rounding."""
    from tvm import s_tir, te, topi

    from aotc.compiler.default_schedules.cpu_attention import AttentionPacks
    x = te.placeholder((1, 2, 32, 16), "float32", "x")
    source = topi.transpose(x, (0, 1, 3, 2)) if pack is attention_kernels.pack_keys else x
    packed = pack(source)
    func = te.create_prim_func([x, packed])
    sch = AttentionPacks().schedule(s_tir.Schedule(func), BF16_TARGET)
    assert sch is not None
    script = sch.mod.script()
    assert "T.vectorized(16)" in script and "T_transpose" not in script
    data = RNG.standard_normal((1, 2, 32, 16)).astype(np.float32)
    out_shape = [int(d) for d in packed.shape]
    out = tvm.runtime.empty(out_shape, "uint16")
    tvm.compile(sch.mod, target=PLAIN_TARGET)["main"](tvm.runtime.tensor(data), out)
    values = data.transpose(0, 1, 3, 2) if pack is attention_kernels.pack_keys else data
    bits = dot_kernels.bf16_bits(values)  # [..., K, N]: K in pairs, N in blocks of 16
    k, n = bits.shape[-2:]
    want = bits.reshape(1, 2, k // 2, 2, n // 16, 16).transpose(0, 1, 4, 2, 5, 3)
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("rows, keys, depth", [(128, 128, 64), (80, 80, 80), (200, 208, 64)])
def test_the_attention_rule_tensorizes_both_products(rows, keys, depth):
    """The Attention rule takes the bf16 kernel for key counts and head dims that are not a
    multiple of its 4-vector tiles (5 and 13 vectors), each product on vdpbf16ps, and the
    kernel it builds computes what the unscheduled one does."""
    from kernel_helpers import bf16_attention_kernel
    from tvm import s_tir

    from aotc.compiler.default_schedules.cpu_attention import Attention
    from aotc.compiler.default_schedules.dot_intrinsics import BF16_FUNCTION
    func, shapes = bf16_attention_kernel(rows, keys, depth)
    sch = Attention().schedule(s_tir.Schedule(func), BF16_TARGET)
    assert sch is not None
    assert sch.mod.script().count(BF16_FUNCTION) == 2
    arrays = [dot_kernels.bf16_bits(RNG.standard_normal(shape).astype(np.float32))
              for shape in shapes[:3]] + [np.zeros(shapes[3], np.float32)]
    results = []
    for mod, target in ((sch.mod, BF16_TARGET), (tvm.IRModule({"main": func}), PLAIN_TARGET)):
        if target is BF16_TARGET and not _runs_bf16():
            continue
        result = tvm.runtime.empty((1, 2, rows, depth), "float32")
        tvm.compile(mod, target=target)["main"](*[tvm.runtime.tensor(a) for a in arrays],
                                                 result)
        results.append(result.numpy())
    if len(results) == 2:
        # the same sums but in another order: a probability next to a bf16 rounding boundary
        # may round the other way (2^-8 of it)
        assert_matches(results[0], results[1], 0.99999, 0.01)


def _runs_bf16() -> bool:
    from aotc.targets import x86
    return x86._BF16_FLAGS <= x86.cpu_flags()


AMX_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})


def test_amx_pads_query_rows_to_its_tasks():
    """On AMX, 197 queries (200 after FuseAttention) are padded to 208, whole 16-row tasks of
    the attention kernel's AMX tiles, and the result's rows sliced back; the numbers stay
    those of the float32 chain. A mask with rows of its own keeps the 200."""
    before = _fused(queries=197, keys=197, scale=("multiply", 0.125))
    with AMX_TARGET:
        after = AttentionBF16(True)(before)
    script = after.script()
    assert "R.nn.pad" in script and "R.strided_slice" in script
    attention = after[after.get_global_var("attention_bf16")]
    assert [int(d) for d in attention.params[0].shape][-2] == 208  # a TIR buffer
    arrays = _arrays(before)
    assert_matches(_run(after, arrays), _run(before, arrays), 0.9999, 0.02)
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, 2, 200, 16), "float32"))
    kt = relax.Var("kt", relax.TensorType((1, 2, 16, 208), "float32"))
    v = relax.Var("v", relax.TensorType((1, 2, 208, 16), "float32"))
    mask = relax.Var("mask", relax.TensorType((1, 1, 200, 208), "float32"))
    with bb.function("main", [q, kt, v, mask]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(bb.emit(relax.op.matmul(q, kt)), mask))
            out = bb.emit_output(relax.op.matmul(bb.emit(relax.op.nn.softmax(s, axis=-1)), v))
        bb.emit_func_output(out)
    with AMX_TARGET:
        masked = AttentionBF16(True)(FuseAttention()(bb.get()))
    assert "R.nn.pad" not in masked.script()

"""The float16-input depthwise conv of an int8 model: legalized with the widening before the
padding (widening_conv.py), and scheduled with an input window per tap row (cpu_depthwise.py)
where the input is widened and the window is read at least twice; the same numbers as the
padding inlined into every tap."""

import re

import numpy as np
import pytest
import tvm
from kernel_helpers import skip_unless_runs_here
from tvm import relax, te, tirx

from aotc.compiler.default_schedules import cpu_depthwise
from aotc.compiler.default_schedules.cpu_rules import Contraction
from aotc.compiler.default_schedules.widening_conv import LEGALIZE_MAP, _conv_of_widened

# the window's tile sizes follow the register count: built for AVX-512 (32 vector registers)
# whatever the host; the runs skip where the host cannot run it
TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})
GENERIC = tvm.target.Target({"kind": "llvm"})
RNG = np.random.default_rng(0)


def _depthwise(shape, kernel, stride, dilation, dtype="float16"):
    """The kernel as widening_conv legalizes it: cast -> pad -> depthwise conv (float32)."""
    channels = shape[-1]
    x = te.placeholder(shape, dtype, name="x")
    w = te.placeholder((kernel, kernel, 1, channels), "float32", name="w")
    pad = (kernel - 1) * dilation // 2
    if dtype == "float32":
        from tvm import topi
        conv = topi.nn.conv(x, w, stride, pad, dilation, channels, "NHWC", "HWIO", "float32")
    else:
        conv = _conv_of_widened(x, w, stride=stride, padding=pad, dilation=dilation,
                                groups=channels, data_layout="NHWC", kernel_layout="HWIO",
                                out_dtype="float32")
    return te.create_prim_func([x, w, conv])


def _scheduled(func, window: bool = True):
    with TARGET:
        if window:
            return Contraction().apply(func, TARGET, False)
        saved = cpu_depthwise.MIN_REUSE, cpu_depthwise.MIN_REUSE_INTEGER
        # no tile qualifies: the padding is inlined
        cpu_depthwise.MIN_REUSE = cpu_depthwise.MIN_REUSE_INTEGER = 10 ** 6
        try:
            return Contraction().apply(func, TARGET, False)
        finally:
            cpu_depthwise.MIN_REUSE, cpu_depthwise.MIN_REUSE_INTEGER = saved


def _block_names(sch) -> set[str]:
    return set(re.findall(r'T\.sblock\("(\w+)"\)', sch.mod.script()))


def _run(sch, args):
    lib = tvm.compile(sch.mod, target=TARGET)
    skip_unless_runs_here(TARGET)
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def _reference(x, w, stride, dilation):
    """Depthwise conv in float64 from the float16 values, zero padding 'same'."""
    kernel = w.shape[0]
    pad = (kernel - 1) * dilation // 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    height = (x.shape[1] + 2 * pad - (kernel - 1) * dilation - 1) // stride + 1
    width = (x.shape[2] + 2 * pad - (kernel - 1) * dilation - 1) // stride + 1
    out = np.zeros((1, height, width, x.shape[3]))
    for i in range(kernel):
        for j in range(kernel):
            rows = xp[:, i * dilation: i * dilation + stride * height: stride,
                      j * dilation: j * dilation + stride * width: stride]
            out += rows * w[i, j, 0]
    return out


def test_legalization_widens_the_input_before_the_padding():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 16), "float16"))
    w = relax.const(RNG.standard_normal((3, 3, 1, 16)).astype(np.float32))
    with bb.function("main", [x]):
        out = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1], groups=16, data_layout="NHWC",
                                         kernel_layout="HWIO", out_dtype="float32"))
        bb.emit_func_output(out)
    before = bb.get()
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(before)
    kernel = [f for gv, f in after.functions.items() if isinstance(f, tirx.PrimFunc)][0]
    script = kernel.script()
    # the cast is a stage of its own, the padded copy holds float32, the taps multiply it
    assert 'T.Cast("float32", x[' in script and 'pad_temp = T.sblock_alloc_buffer' in script
    assert "float16" not in script.split('T.sblock("pad_temp")')[1].split("T.writes")[0]
    data = RNG.standard_normal((1, 8, 8, 16)).astype(np.float16)
    default = relax.transform.LegalizeOps()(before)
    outputs = []
    for mod in (default, after):
        # unscheduled: built for any x86-64, so that it runs on every host
        vm = relax.VirtualMachine(tvm.compile(mod, target=GENERIC), tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(data)).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])  # the same float32 sums


def test_window_is_computed_per_tap_row_small_enough_for_the_stack():
    sch = _scheduled(_depthwise((1, 56, 56, 144), 3, 1, 1))
    names = _block_names(sch)
    assert "pad_temp" in names, names  # kept as the window, not inlined into the taps
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("pad_temp"))]
    pixels, lanes = int(loops[-2].extent), int(loops[-1].extent)
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
    assert pixels * lanes * 4 < cpu_depthwise.STACK_ALLOCATION_LIMIT, (pixels, lanes)
    # under the parallel tile and the tap rows: one window per tile and tap row
    assert loops[0].kind == tvm.tirx.ForKind.PARALLEL and int(loops[1].extent) == 3
    taps = sch.get(sch.get_sblock("group_conv2d_nhwc_update")).body
    assert "pad_temp" in str(taps) and "if_then_else" not in str(taps)  # unguarded reads


@pytest.mark.parametrize("stride, dtype", [(2, "float16"), (1, "float32")])
def test_no_window_where_it_was_measured_slower(stride, dtype):
    """Stride 2 reads each window element ~1.4 times; a float32 input has nothing to widen."""
    sch = _scheduled(_depthwise((1, 28, 28, 64), 3, stride, 1, dtype))
    assert "pad_temp" not in _block_names(sch)


@pytest.mark.parametrize("shape, kernel, stride, dilation", [
    ((1, 56, 56, 144), 3, 1, 1),
    ((1, 14, 14, 48), 5, 1, 1),
    ((1, 21, 21, 32), 3, 1, 2),
    ((1, 7, 7, 96), 7, 1, 1),
    ((1, 28, 28, 64), 5, 2, 1),
])
def test_window_computes_what_the_inlined_padding_does(shape, kernel, stride, dilation):
    func = _depthwise(shape, kernel, stride, dilation)
    x = RNG.standard_normal(shape).astype(np.float16)
    w = RNG.standard_normal((kernel, kernel, 1, shape[-1])).astype(np.float32)
    out_shape = [int(d) for d in func.params[-1].shape]
    windowed = _run(_scheduled(func), [x, w, np.zeros(out_shape, np.float32)])
    inlined = _run(_scheduled(func, window=False), [x, w, np.zeros(out_shape, np.float32)])
    np.testing.assert_allclose(windowed, _reference(x, w, stride, dilation), rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_allclose(windowed, inlined, rtol=1e-6, atol=1e-5)


def test_window_rows_are_a_tuning_decision_whose_schedules_compute_the_conv():
    """In the tuner's default-rules space the window's output pixels per tile are a sampled
    decision (default: the untuned choice, the largest that fits); every choice computes the
    same conv."""
    from tvm.s_tir import meta_schedule as ms

    from aotc.schedules.space import default_rules_space

    func = _depthwise((1, 28, 28, 64), 3, 1, 1).with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    context = ms.TuneContext(mod, target=TARGET, space_generator=default_rules_space(TARGET),
                             search_strategy="evolutionary", task_name="dw", num_threads=2)
    (space,) = context.space_generator.generate_design_space(mod)
    trace = space.trace
    (inst,) = [i for i in trace.insts if i.kind.name == "SampleCategorical"]
    choices = [int(c) for c in inst.attrs[0]]
    assert choices[int(trace.decisions[inst])] == max(choices) == 7 and len(choices) > 1
    x = RNG.standard_normal((1, 28, 28, 64)).astype(np.float16)
    w = RNG.standard_normal((3, 3, 1, 64)).astype(np.float32)
    want = _reference(x, w, 1, 1)
    for index in range(len(choices)):
        sch = tvm.s_tir.Schedule(mod)
        trace.with_decision(inst, index, True).apply_to_schedule(sch, remove_postproc=True)
        got = _run(sch, [x, w, np.zeros((1, 28, 28, 64), np.float32)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape, kernel, stride", [((1, 56, 56, 144), 3, 1),
                                                   ((1, 14, 14, 48), 5, 1),
                                                   ((1, 56, 56, 96), 3, 2)])
def test_a_uint8_input_is_widened_into_the_window_too(shape, kernel, stride):
    """DepthwiseByteInput's convs (uint8 input, float32 weights): the same window, at stride 2
    too (widening a byte takes two instructions per tap, so less reuse pays), and the sums of
    the byte values exactly as a float64 reference (small integers times float32)."""
    func = _depthwise(shape, kernel, stride, 1, dtype="uint8")
    sch = _scheduled(func)
    assert "pad_temp" in _block_names(sch)
    x = RNG.integers(0, 256, shape).astype(np.uint8)
    w = RNG.standard_normal((kernel, kernel, 1, shape[-1])).astype(np.float32)
    out = np.zeros([int(d) for d in func.params[-1].shape], np.float32)
    windowed = _run(sch, [x, w, out])
    inlined = _run(_scheduled(func, window=False), [x, w, out.copy()])
    np.testing.assert_allclose(windowed, _reference(x, w, stride, 1), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(windowed, inlined, rtol=1e-6, atol=1e-4)

"""The input window of a depthwise conv's register tile: the zero-padded input row segment
that one row of taps reads, widened to float32 once per tap row into a small buffer that the
multiply-adds of every tap of that row read.

Why: an int8 model's depthwise convs read float16 or uint8 (quantize/depthwise_half_input.py,
depthwise_byte_input.py). With the padding inlined into the conv
(cpu_contraction.inline_padding), every tap of every output pixel loads its own input vector
behind its own bounds check and widens it (``vcvtph2ps``, which competes with the
multiply-adds for the same ports). A 3x3 tap row over a tile of R pixels at stride 1 touches
R + 2 input pixels but made 3R such loads; the window makes R + 2, and the taps read it
unguarded. It stays under TVM's stack-allocation limit, so LLVM keeps it
in registers (a larger one becomes a TVMBackendAllocWorkspace call in every parallel tile).

A window pays only where the input is widened and each window element is read at least
twice (``MIN_REUSE``): at stride 2 a window of 2R + 1 pixels serves 3R taps, too little reuse
for a float16 input, and a float32 input has nothing to widen. A uint8 input widens in two
instructions per tap, so there stride 2 pays too, and integer inputs need only 1.3 reads per
window element (``MIN_REUSE_INTEGER``); measurements in
docs/design/measurements.md#compilerdefault_schedulescpu_depthwisepy.

Which kernels: a contraction whose reduction is the taps of one channel (groups = channels),
NHWC, reading a zero-padded copy of a narrower input: float16, bfloat16 or uint8 (the copy
is what holds the bounds checks; widening_conv.py puts the cast before it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import ScheduleError
from tvm.sym import detect_linear_equation

# TVM's LowerTVMBuiltin puts a CPU allocation on the stack only below this many bytes.
STACK_ALLOCATION_LIMIT = 1024
# Fewer output pixels per tile than this reuse too little of the window to pay for it.
_MIN_WINDOW_ROWS = 3
_MAX_WINDOW_ROWS = 16
# Taps per window element, at least (see the module docstring: stride 2 reuses 1.4x): twice
# for float16 inputs (one vcvtph2ps per tap saved), 1.3 times for integer ones, whose
# widening is two instructions per tap (vpmovzxbd + vcvtdq2ps).
MIN_REUSE = 2
MIN_REUSE_INTEGER = 1.3


@dataclass(frozen=True)
class Window:
    """The padded-input block (kept, not inlined) and the geometry of one tap row."""
    block: s_tir.SBlockRV
    stride: int     # input pixels between two output pixels
    taps: int       # taps in one row of the kernel (kw)
    dilation: int
    bytes_per_pixel: int  # of one column block of the window: lanes x element size
    min_reuse: float = MIN_REUSE  # taps per window element, at least

    def pixels(self, rows: int) -> int:
        return (rows - 1) * self.stride + (self.taps - 1) * self.dilation + 1

    def fits(self, rows: int, registers: int) -> bool:
        """On the stack (so in registers after unrolling), window + accumulators + one weight
        vector within the register file, and each window element read ``min_reuse`` times."""
        pixels = self.pixels(rows)
        return (pixels * self.bytes_per_pixel < STACK_ALLOCATION_LIMIT
                and pixels + rows + 1 <= registers
                and rows * self.taps >= self.min_reuse * pixels)


def _static(value) -> int | None:
    return int(value) if isinstance(value, (int, tirx.IntImm)) else None


def find_window(sch: s_tir.Schedule, main, infos, lanes: int, registers: int) -> Window | None:
    """The window of ``main`` (a normalized block info) or None when it is not a padded
    depthwise conv or no tile of its output rows fits one. Changes nothing: the caller then
    inlines the copy's producers (``inline_into_window``)."""
    block = sch.get(main.block_rv)
    kinds, dom = main.dom_kind(), main.dom()
    # normalized: unit axes dropped, so a depthwise conv is [N,] H, W, C x KH, KW
    if kinds not in ("SSSRR", "SSSSRR"):
        return None
    producers = infos[:infos.index(main)]
    if not producers:
        return None
    pad = producers[-1]
    pad_buffer = sch.get(pad.block_rv).writes[0].source
    reads = [r for r in block.reads if r.source.same_as(pad_buffer)]
    if len(reads) != 1 or len(reads[0].region) != 4 or len(block.iter_vars) != len(kinds):
        return None
    narrow = _widened_from(sch, producers, pad_buffer)
    if not _is_zero_padding(sch.get(pad.block_rv)) or narrow is None:
        return None
    w_var, tap_var = block.iter_vars[-4].var, block.iter_vars[-1].var
    coefficients = detect_linear_equation(reads[0].region[2].min, [w_var, tap_var])
    if len(coefficients) != 3:
        return None
    stride, dilation, taps = (_static(coefficients[0]), _static(coefficients[1]),
                              _static(dom[-1]))
    if not stride or not dilation or not taps:
        return None
    window = Window(pad.block_rv, stride, taps, dilation,
                    lanes * max(int(pad_buffer.dtype.bits), 8) // 8,
                    MIN_REUSE_INTEGER if narrow.startswith(("uint", "int")) else MIN_REUSE)
    width = _static(dom[-4])
    if width is None or not window_rows(window, width, registers):
        return None
    return window


def inline_into_window(sch: s_tir.Schedule, main, infos, window: Window) -> Window | None:
    """Inline the padded copy's producers (the widening cast) into it; the window with its
    block re-read, or None when a producer would not inline. Then the ones inlined so far
    went into the copy, and the caller must re-read the blocks."""
    name = sch.get(window.block).name_hint
    for producer in infos[:infos.index(main) - 1]:
        try:
            sch.compute_inline(producer.block_rv)
        except ScheduleError:
            return None
    return dataclasses.replace(window, block=sch.get_sblock(name))


def _widened_from(sch: s_tir.Schedule, producers, pad_buffer) -> str | None:
    """The narrower type (float16, bfloat16, uint8...) the copy's producers read and the float
    copy widens, or None."""
    bits = int(pad_buffer.dtype.bits)
    if not str(pad_buffer.dtype).startswith("float"):
        return None
    for region in (r for p in producers for r in sch.get(p.block_rv).reads):
        dtype = str(region.source.dtype)
        if dtype.startswith(("float", "bfloat", "uint", "int")) and \
                int(region.source.dtype.bits) < bits:
            return dtype
    return None


def _is_zero_padding(block) -> bool:
    """``pad[...] = if_then_else(in bounds, x[...], 0)``, as TOPI's pad writes it."""
    value = getattr(block.body, "value", None)
    call = value.value if isinstance(value, tirx.Cast) else value
    if not isinstance(call, tvm.ir.expr.Call):
        return False
    return (str(getattr(call.op, "name", "")).endswith(".if_then_else")
            and isinstance(call.args[2], (tirx.FloatImm, tirx.IntImm))
            and float(call.args[2].value) == 0.0)


def window_rows(window: Window, extent: int, registers: int) -> list[int]:
    """Output pixels per tile for which the window fits, largest first; they divide the
    output row (no ragged tile). Empty: keep the padding inlined."""
    return [r for r in range(min(extent, _MAX_WINDOW_ROWS), _MIN_WINDOW_ROWS - 1, -1)
            if extent % r == 0 and window.fits(r, registers)]


def place_window(sch: s_tir.Schedule, window: Window, tap_row_loop) -> None:
    """Compute the window under the loop over tap rows: one padded (and widened) input row
    segment per tap row, its channels vectorized and its pixels unrolled."""
    sch.compute_at(window.block, tap_row_loop, preserve_unit_loops=True)
    loops = sch.get_loops(window.block)
    sch.vectorize(loops[-1])
    sch.unroll(loops[-2])

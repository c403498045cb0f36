"""The search space: MetaSchedule's own design space for the target (PostOrderApply with the
target's schedule rules, postprocessors and mutators), united with aotc's default rules as a
space of their own.

The default-rules space is compiler/default_schedules's PackedDot rule (int8 and bf16 kernels) or
else its
Contraction rule, run on MetaSchedule's traced schedule with ``tunable=True``: the register
tile (rows x columns) becomes two sampled decisions whose default values are the untuned
choices. The packed kernels also give two design spaces, one for each order of their
parallel tiles (pixels first or channel blocks first: a structural choice that a sampled
decision could not change on replay). So the untuned schedule is a point of the search space,
and the search samples the tiles around it. The Winograd transforms
(compiler/default_schedules/cpu_winograd.py)
add their untuned schedule, without decisions, so that it stays a candidate, and so does
every other kernel (attention, row reductions such as softmax and layer norm, elementwise,
pooling): its default rule's schedule (compiler/default_schedules/cpu_rules.py) as a space of one
point.
Without it, the best schedule the tuner measures for a kernel such as attention can be
several times slower than the untuned one, and the task scheduler goes on giving trials to a
kernel whose tuning can only lose. int8 kernels get the default rules'
spaces only (NO_METASCHEDULE_SPACE)."""

from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm.error import InternalError
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import ScheduleError

from aotc.compiler.default_schedules import first_schedule_that_works
from aotc.compiler.default_schedules.cpu_contraction import Contraction
from aotc.compiler.default_schedules.cpu_dot import PackedDot, packed_format
from aotc.compiler.default_schedules.cpu_rules import RULES
from aotc.compiler.default_schedules.cpu_winograd import WinogradTransform
from aotc.errors import meaningful_line

from .intrinsics import register_cpu_intrinsics

LOG = logging.getLogger("aotc.tuning")
# The default rules without sampled decisions: a kernel none of the tunable ones takes gets
# the schedule of the first of these that accepts it, as compile does.
FIXED_RULES = tuple(rule for rule in RULES
                    if not isinstance(rule, (PackedDot, WinogradTransform, Contraction)))


def default_rules_space(target: tvm.target.Target) -> ms.space_generator.ScheduleFn:
    register_cpu_intrinsics()  # before any TuneContext sees it (intrinsics.py)
    def schedule(sch):
        func = sch.mod["main"]  # as given: a rule that gives up may have edited ``sch``
        try:
            # the packed kernels' two orders of their parallel tiles: one space each
            packed = [PackedDot().schedule(sch.copy(), target, tunable=True, pixels=pixels)
                      for pixels in (True, False)]
            if packed[0] is not None:
                return packed
            if WinogradTransform().schedule(sch, target) is not None:
                return [sch]  # the Winograd transforms: their default as a candidate
            scheduled = Contraction().schedule(sch, target, tunable=True)
        except (ScheduleError, InternalError) as err:
            # On MetaSchedule's traced schedule, TVM 0.27's reverse_compute_inline can fail
            # with an InternalError ("Cannot dispatch a null expression": EfficientNet-style
            # conv epilogues) where the untraced default schedule succeeds. Such a kernel
            # gets MetaSchedule's space only, instead of ending the whole tuning run.
            LOG.info("default-rules space skipped for %s: %s", sch.mod.get_global_vars()[0],
                     meaningful_line(err))
            return []
        if scheduled is None:  # not a contraction: its untuned schedule, without decisions
            default = first_schedule_that_works(FIXED_RULES, func, target)
            return [] if default is None else [default]
        return [sch]
    return ms.space_generator.ScheduleFn(schedule)


# Packed formats whose kernels MetaSchedule's own space cannot build: on an int8 1x1 conv of
# MobileNetV2, each of the 46 candidates (of 48 trials) from its three design spaces failed
# to build (LLVM module verification, 40; "Cannot broadcast lanes=16 to 32", 6), and 10
# minutes of tuning the int8 model measured about half of its trials as failures. Those
# kernels get the default rules' spaces only.
NO_METASCHEDULE_SPACE = frozenset({"int8"})


_SPACE_BUILDS: dict[tuple[str, int], bool] = {}


def metaschedule_space_builds(target: tvm.target.Target, func: tvm.tirx.PrimFunc) -> bool:
    """Whether MetaSchedule's own design space for ``func`` can be generated (asked once per
    target and kernel: each search round makes its spaces anew). For a sapphirerapids target
    its rules fail on the one-kernel attention (a ScheduleError in reverse-compute-at), and
    the error ended the whole tuning run; such a kernel is tuned in the default rules' space
    only."""
    key = (str(target), tvm_ffi.structural_hash(func))
    if key not in _SPACE_BUILDS:
        _SPACE_BUILDS[key] = _space_builds(target, func)
    return _SPACE_BUILDS[key]


def _space_builds(target: tvm.target.Target, func: tvm.tirx.PrimFunc) -> bool:
    context = ms.TuneContext(tvm.IRModule({"main": func}), target=target,
                             space_generator=ms.space_generator.PostOrderApply(),
                             task_name="probe", num_threads=1)
    try:
        context.generate_design_space()
    except (ScheduleError, InternalError) as err:
        LOG.info("MetaSchedule's space skipped for %s: %s",
                 func.attrs.get("global_symbol", "a kernel") if func.attrs else "a kernel",
                 meaningful_line(err))
        return False
    return True


def search_space(target: tvm.target.Target,
                 func: tvm.tirx.PrimFunc | None = None) -> ms.space_generator.SpaceGenerator:
    """The union (for ``func``, the kernel tuned: without MetaSchedule's space when its
    packed format is one that space cannot build, or when that space fails to generate:
    metaschedule_space_builds); registers the CPU tensor intrinsics first, so that the
    TuneContext it goes into finds them loaded instead of importing every backend's
    (intrinsics.py)."""
    register_cpu_intrinsics()
    # the default rules' spaces first: a search's first round measures the design spaces in
    # order, as many as the round holds, and MetaSchedule gives BERT's attention kernel 81
    # (its layer norm 9), so the untuned schedule placed after them was never measured
    spaces = [default_rules_space(target)]
    if func is None or (packed_format(func) not in NO_METASCHEDULE_SPACE and
                        metaschedule_space_builds(target, func)):
        spaces.append(ms.space_generator.PostOrderApply())
    return ms.space_generator.SpaceGeneratorUnion(spaces)

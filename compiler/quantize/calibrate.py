"""Calibration: run the float32 model on samples and record each site's activation range.

The module is taken just before the quantize phase (the sites' names are found the same way
annotate finds them). Every site's activation becomes an extra output of ``main``; that module
goes through the rest of the pipeline (fused, scheduled, built like any model, so calibration
runs at compiled speed) and runs in this process. Each sample's activations go straight into
the observers and are dropped. The same build serves the accuracy report: its first output
is the float32 model's, and the activations show each layer's quantization error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from aotc.options import CompileOptions

from ..contraction_sites import Site
from ..relax_walk import mutate_functions
from . import observers


@relax.expr_functor.mutator
class _Exposer(relax.PyExprMutator):
    """Makes the chosen dataflow variables outputs of their dataflow block."""

    def __init__(self, mod, chosen):
        super().__init__(mod)
        self.chosen = chosen
        self.exposed = {}

    def visit_var_binding_(self, binding):
        if binding.var not in self.chosen:
            super().visit_var_binding_(binding)
            return
        out = self.builder_.emit_output(self.visit_expr(binding.value), binding.var.name)
        self.exposed[binding.var] = out
        self.set_var_remap(binding.var, out)


def observed_module(mod: tvm.IRModule, sites: list[Site]
                    ) -> tuple[tvm.IRModule, list[str], list]:
    """(``mod`` whose main returns (its outputs, activation 0, activation 1, ...), the first
    site of each distinct activation, the activations)."""
    activations, owners = [], []
    for site in sites:
        if not any(site.activation.same_as(a) for a in activations):
            activations.append(site.activation)
            owners.append(site.name)
    chosen = [a for a in activations if isinstance(a, relax.DataflowVar)]
    exposer = _Exposer(mod, chosen)
    mod = mutate_functions(mod, exposer)
    main = mod["main"]
    extra = [exposer.exposed.get(a, a) for a in activations]
    body = relax.SeqExpr(main.body.blocks, relax.Tuple([main.body.body, *extra]))
    mod = mod.clone()
    ret = relax.TupleType([main.ret_ty, *[e.ty for e in extra]])
    mod["main"] = relax.Function(main.params, body, ret, main.is_pure, main.attrs)
    return relax.transform.Normalize()(mod), owners, activations


@dataclass
class CalibrationRun:
    """The built observed module: run(feed) -> (model outputs, {site owner: activation})."""
    vm: object
    input_names: list[str]
    owners: list[str]
    activations: list  # the Relax expressions observed, in output order

    def run(self, feed: dict) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        device = tvm.cpu()
        args = [tvm.runtime.tensor(np.ascontiguousarray(feed[n]), device)
                for n in self.input_names]
        result = self.vm["main"](*args)
        outputs = result[0]
        outputs = [outputs[i] for i in range(len(outputs))] if hasattr(outputs, "__len__") \
            and not hasattr(outputs, "numpy") else [outputs]
        activations = {name: result[i + 1].numpy() for i, name in enumerate(self.owners)}
        return [o.numpy() for o in outputs], activations


def build_observed(mod: tvm.IRModule, sites: list[Site], input_names: list[str], spec,
                   target, options: CompileOptions, finalize) -> CalibrationRun:
    """Compile the observed module (``mod`` as the quantize phase would receive it) from the
    quantize phase on, in float32; ``finalize`` is the target's post-scheduling pipeline."""
    from ..pipeline import run_phases
    observed, owners, activations = observed_module(mod, sites)
    float_options = CompileOptions(opt_level=options.opt_level,
                                   disabled_passes=options.disabled_passes)
    observed = run_phases(observed, spec, target, float_options, start_at="quantize")
    executable = relax.build(observed, target, relax_pipeline=finalize(spec, target))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return CalibrationRun(vm, input_names, owners, activations)


def calibrate(run: CalibrationRun, sites: list[Site], samples: list[dict], method: str,
              percentile: float = 99.99,
              progress: Callable[[str], None] | None = None) -> dict[str, tuple[float, float]]:
    """site name -> (low, high) over ``samples`` by ``method`` (observers.METHODS)."""
    say = progress or (lambda _msg: None)
    owners = owner_of(run, sites)
    watched = {owner: observers.create(method, percentile) for owner in set(owners.values())}
    for i, feed in enumerate(samples):
        _, activations = run.run(feed)
        for owner, observer in watched.items():
            observer.update(activations[owner])
        if (i + 1) % max(1, len(samples) // 10) == 0 or i + 1 == len(samples):
            say(f"calibrating: {i + 1}/{len(samples)} samples")
    return {site.name: watched[owners[site.name]].range() for site in sites}


def owner_of(run: CalibrationRun, sites: list[Site]) -> dict[str, str]:
    """site name -> the observed output (named by its first site) holding its activation."""
    out = {}
    for site in sites:
        for activation, owner in zip(run.activations, run.owners):
            if site.activation.same_as(activation):
                out[site.name] = owner
    return out

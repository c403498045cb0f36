"""Shape buckets: one library, kernels specialized per bucket of a symbolic dim, a call
dispatched to the smallest bucket that fits.

Why: kernels over a symbolic sequence length cannot pick register tiles for it (attention's
[seq, seq] is padded to whole tiles and its softmax rows are masked), so a model compiled with
dynamic axes runs slower than one compiled for a fixed length (1.0-1.25x for a BERT, more at
short lengths). Variable-length traffic served through buckets runs at the fixed-length speed
of the bucket, plus what the padding costs.

How: the imported module's ``main`` is specialized for each combination of buckets
(``bind_symbolic_vars``) and optimized on its own, exactly as a fixed-shape compile; the
symbolic ``main`` is kept for calls that fit no bucket. The optimized modules are merged into
one (each function and kernel renamed with its bucket's suffix; weights that came out equal,
byte for byte, are kept once). The runtime pads the inputs along the bucketed dims with zeros,
calls the bucket's entry and crops the outputs back (runtime/model.py). Padding is right only
for models that mask what it adds (an attention mask that is 0 on padding, causal attention):
``verify_padding`` compares padded and unpadded runs before the library is kept.

Which to run: a call that pads a long way (384 tokens in a 512 bucket) can cost more than the
symbolic entry at its own length. ``symbolic_costs`` times the symbolic entry against each
bucket's at the bucket's size while compiling (the ratio, not the times, is kept: it carries
over to other machines of a kind better than absolute times do); the runtime runs the bucket
only while the padding (bucket size / real size, over the bucketed dims) is at most that
ratio."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import tvm
from tvm import relax

from aotc.errors import AotcError, UnsupportedModelError
from aotc.runtime.inputs import random_inputs
from aotc.runtime.profile import median_ms
from aotc.runtime.signature import ModelSignature

from .frontends.shapes import check_dim_names
from .relax_walk import mutate_functions


def combinations(buckets: dict[str, tuple[int, ...]]) -> list[dict[str, int]]:
    """Every combination of one size per bucketed dim, smallest first."""
    names = sorted(buckets)
    return [dict(zip(names, sizes)) for sizes in
            itertools.product(*(sorted(buckets[n]) for n in names))]


def entry_name(sizes: dict[str, int]) -> str:
    return "main_" + "_".join(f"{name}{size}" for name, size in sorted(sizes.items()))


def check_buckets(buckets: dict, signature: ModelSignature, source: str) -> None:
    check_dim_names("--buckets", buckets, signature.inputs, source)
    for name, sizes in buckets.items():
        low, high = signature.dim_ranges.get(name, (1, None))
        bad = [s for s in sizes if s < low or (high is not None and s > high)]
        if bad or not sizes:
            raise AotcError(f"{source}: --buckets {name}: sizes {bad or 'none'} outside the "
                            f"dim's range {low} to {high or 'any'}")


def specialize(mod: tvm.IRModule, sizes: dict[str, int]) -> tvm.IRModule:
    """The module whose ``main`` has the bucketed dims fixed to ``sizes``."""
    main = mod["main"].bind_symbolic_vars(dict(sizes))
    out = tvm.IRModule({k: v for k, v in mod.functions_items() if k.name_hint != "main"})
    out["main"] = main.with_attr("global_symbol", "main")
    return out


@relax.expr_functor.mutator
class _Renamer(relax.PyExprMutator):
    """References to the module's functions and kernels go to their renamed copies; constants
    go to the one kept copy of equal bytes."""

    def __init__(self, mod, renamed: dict, constants: dict):
        super().__init__(mod)
        self.renamed, self.constants = renamed, constants

    def visit_global_var_(self, gvar):
        return self.renamed.get(gvar.name_hint, gvar)

    def visit_generic_const_(self, const):
        array = const.value.numpy()
        key = (str(array.dtype), array.shape, hashlib.sha256(array.tobytes()).hexdigest())
        return self.constants.setdefault(key, const)


def merge(modules: dict[str, tvm.IRModule]) -> tvm.IRModule:
    """One module holding every module's functions, each renamed ``name`` -> ``name`` +
    suffix (the suffix "" keeps the names); equal kernels and equal constants are shared."""
    builder = relax.BlockBuilder()
    constants: dict = {}
    for suffix, mod in modules.items():
        renamed = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc):
                private = func.without_attr("global_symbol") if func.attrs and \
                    "global_symbol" in func.attrs else func
                renamed[gv.name_hint] = builder.add_func(private, gv.name_hint + suffix)
        relax_only = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                                   if isinstance(f, relax.Function)})
        rewritten = mutate_functions(relax_only, _Renamer(relax_only, renamed, constants))
        for gv, func in rewritten.functions_items():
            if isinstance(func, relax.Function):
                name = gv.name_hint + suffix
                builder.add_func(func.with_attr("global_symbol", name), name)
    return builder.get()


def verify_padding(path, signature: ModelSignature, table: dict, rtol=1e-3, atol=1e-4) -> None:
    """Run each bucket padded against the symbolic entry unpadded, on a length short of the
    bucket; refuse the library when they differ: the model does not mask what padding adds."""
    from aotc.runtime import load
    model = load(path)
    for key, entry in table["entries"].items():
        sizes = dict(table["sizes"][key])
        shorter = {name: max(1, size * 3 // 4) for name, size in sizes.items()}
        feed = _feed(signature, shorter)
        padded = model.run(feed, entry=entry)
        exact = model.run(feed, entry="main")
        for name, got in padded.items():
            want = exact[name]
            if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol,
                                                          equal_nan=True):
                raise UnsupportedModelError(
                    f"--buckets: padding {shorter} up to the bucket {sizes} changes output "
                    f"{name!r}; the model does not mask the padding it gets (no attention "
                    "mask input, or padding that is not zeros): compile it without buckets")


def symbolic_costs(path, signature: ModelSignature, table: dict,
                   runs: int = 3) -> dict[str, float]:
    """Bucket key -> time of the symbolic entry / time of the bucket's entry, both at the
    bucket's size (medians of ``runs``, as aotc profile times), measured on the exported
    library at ``path`` in this process (a CPU target). Not on the in-memory executable:
    running that one leaves empty memory scopes in it, which every load of the library
    exported from it would then report."""
    from aotc.runtime.model import Model
    model = Model(path)
    costs = {}
    for key, entry in table["entries"].items():
        feed = _feed(signature, dict(table["sizes"][key]))
        args = [model.tensor(np.ascontiguousarray(feed[spec.name]))
                for spec in signature.inputs]
        times = {name: median_ms(lambda n=name, a=args: model.call_entry(n, a), runs)
                 for name in (entry, "main")}
        costs[key] = round(times["main"] / times[entry], 3)
    return costs


def _feed(signature: ModelSignature, sizes: dict[str, int]) -> dict:
    """Random inputs (runtime/inputs.py) with the bucketed dims at ``sizes``, and masks of
    ones: every position is real, so only the padding can change the outputs."""
    feed = random_inputs(signature, seed=0, dims=sizes)
    for name, value in feed.items():
        if "mask" in name.lower():
            feed[name] = np.ones_like(value)
    return feed

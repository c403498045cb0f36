"""PyTorch frontend: an nn.Module with example inputs (via torch.export), or a saved .pt2
ExportedProgram. torch is imported only here, and only when this path is used."""

from __future__ import annotations

import os
from pathlib import Path

from aotc.errors import CompileError, ModelLoadError, meaningful_line
from aotc.runtime.signature import ModelSignature, TensorSpec

from .imported import ImportedModel, output_specs
from .pt2_archive import checked_bytes
from .torch_ops import check_torch_ops
from .torch_rewrites import CUSTOM_CONVERTERS, drop_empty_cat_inputs


def _export(module, example_inputs):
    import torch
    if example_inputs is None:
        raise ModelLoadError("a torch.nn.Module needs example_inputs (a tuple of tensors)")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    # exported for inference; the caller's module (mid-training, say) keeps its modes
    modes = {sub: sub.training for sub in module.modules()}
    try:
        return torch.export.export(module.eval(), tuple(example_inputs))
    except Exception as err:
        raise ModelLoadError(f"torch.export failed for {type(module).__name__}: "
                             f"{type(err).__name__}: {str(err).splitlines()[0]}") from err
    finally:
        for sub, training in modes.items():
            sub.training = training


def _load_pt2(path: Path, trust_pickle: bool = False):
    import torch
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    archive = checked_bytes(path, trust_pickle)
    try:
        return torch.export.load(archive)
    except Exception as err:
        raise ModelLoadError(f"{path}: not a loadable .pt2 ExportedProgram ({err})") from None


def _signature_inputs(program) -> list[TensorSpec]:
    specs = []
    user_inputs = program.graph_signature.user_inputs
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for name in user_inputs:
        meta = placeholders[name].meta["val"]
        shape = tuple(int(d) if str(d).isdigit() else str(d) for d in meta.shape)
        specs.append(TensorSpec(name, shape, str(meta.dtype).replace("torch.", "")))
    return specs


def import_torch(source, example_inputs=None, trust_pickle: bool = False) -> ImportedModel:
    """``trust_pickle``: load a .pt2 even where torch would unpickle part of it (pt2_archive)."""
    if isinstance(source, (str, os.PathLike)):
        program, name = _load_pt2(Path(source), trust_pickle), str(source)
    else:
        program, name = _export(source, example_inputs), type(source).__name__
    from tvm.relax.frontend.torch import from_exported_program
    program = program.run_decompositions()  # what TVM's importer would see; done once, here
    drop_empty_cat_inputs(program)
    check_torch_ops(program, name)
    try:
        mod = from_exported_program(program, keep_params_as_input=False,
                                    unwrap_unit_return_tuple=True, run_ep_decomposition=False,
                                    custom_convert_map=CUSTOM_CONVERTERS)
    except Exception as err:
        raise CompileError(f"{name}: TVM's PyTorch importer failed: {type(err).__name__}: "
                           f"{meaningful_line(err)}") from err
    inputs = tuple(_signature_inputs(program))
    return ImportedModel(mod, ModelSignature(inputs, output_specs(mod, [])), name)

"""ONNX frontend: file or ModelProto -> validated Relax module + signature.

Order matters: read the file (refusing external data outside the model's folder), check ops,
work out input shapes, and only then call TVM's importer."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from aotc.errors import (
    AotcError,
    CompileError,
    ModelLoadError,
    UnsupportedModelError,
    meaningful_line,
)
from aotc.runtime.exotic_dtypes import carried_dtype
from aotc.runtime.signature import ModelSignature, TensorSpec

from .imported import ImportedModel, output_specs
from .onnx_fold import fold_constants
from .onnx_functions import expand_functions
from .onnx_graph import GraphInfo, with_fixed_inputs
from .onnx_lowbit import CARRIED, carry_narrow_types, needs_carrying
from .onnx_ops import check_ops, model_opset, ops_to_expand
from .onnx_qlinear import expand_qlinear
from .onnx_rewrites import INLINING, apply_rewrites
from .shapes import apply_overrides, check_dim_names


def read_onnx(source: str | os.PathLike | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Load the model and its external data; returns (model, name for messages). The model is
    the import's own: a ModelProto passed in is copied."""
    if isinstance(source, onnx.ModelProto):
        if any(external_data_helper.uses_external_data(t) for t in _initializers(source)):
            raise ModelLoadError("in-memory ModelProto refers to external data files; pass the "
                                 "model's path so they can be resolved in its folder")
        # the import folds and rewrites in place: the caller's model must stay as it was
        model = onnx.ModelProto()
        model.CopyFrom(source)
        return model, "<ModelProto>"
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # protobuf raises DecodeError and friends
        raise ModelLoadError(f"{path}: not a readable ONNX model "
                             f"({type(err).__name__}: {err})") from None
    _check_external_data(model, path)
    if any(external_data_helper.uses_external_data(t) for t in _initializers(model)):
        external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model, str(path)


def _initializers(model: onnx.ModelProto):
    return list(model.graph.initializer)


def _check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """External data must be a file inside the model's folder: a model must not be able to
    make the compiler read /etc/passwd or a neighbour's weights."""
    folder = path.parent.resolve()
    for tensor in _initializers(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        target = (folder / location).resolve()
        if os.path.isabs(location) or folder not in target.parents:
            raise ModelLoadError(f"{path}: initializer {tensor.name!r} refers to external data "
                                 f"{location!r} outside the model's folder {folder}")
        if not target.is_file():
            raise ModelLoadError(f"{path}: initializer {tensor.name!r} refers to missing external "
                                 f"data file {location!r}")


def _elem_dtype(elem_type: int) -> str:
    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def graph_inputs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Real inputs: graph inputs that are not initializers (old exports list weights too)."""
    weights = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        if not value.type.HasField("tensor_type"):
            raise UnsupportedModelError(
                f"input {value.name!r} is a {value.type.WhichOneof('value')} value; compiled "
                "models take tensors only")
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                     else (d.dim_param or "?") for d in tensor.shape.dim)
        specs.append(TensorSpec(value.name, dims, _elem_dtype(tensor.elem_type)))
    return specs


MAX_EXPANSION_DEPTH = 4


def prepare_for_tvm(model: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    """Expand ops TVM cannot convert from their spec function bodies, fold constant shape
    arithmetic, then rewrite what TVM converts wrongly (the op check has already run on the
    user's graph). Shape inference runs again after folding: folded shapes
    let it see through Reshape and Expand. ``model`` may be changed in place."""
    opset = model_opset(model)

    def info(current: onnx.ModelProto) -> GraphInfo:  # one shape inference per call
        return GraphInfo(with_fixed_inputs(current, shapes), opset)
    model = expand_qlinear(model, info(model).fresh)
    # Bodies may call further function ops (SoftmaxCrossEntropyLoss calls
    # NegativeLogLikelihoodLoss): expand until none is left or nothing changes.
    for _round in range(MAX_EXPANSION_DEPTH):
        expand = ops_to_expand(model)
        if not expand:
            break
        expanded = expand_functions(model, info(model), expand)
        if expanded is model:
            break
        model = expanded
    model = fold_to_fixpoint(model, info)
    if needs_carrying(model):
        model = carry_narrow_types(model, info(model))
    # Inlined If branches and unrolled Scan bodies get their shape arithmetic folded and their
    # own nodes rewritten in the next round (nested control flow is refused, so two suffice).
    for _round in range(2):
        model, rewritten = apply_rewrites(model, info(model))
        if not any(op in rewritten for op in INLINING):
            break
        model = fold_to_fixpoint(model, info)
    return model


MAX_FOLD_ROUNDS = 32


def fold_to_fixpoint(model: onnx.ModelProto, info) -> onnx.ModelProto:
    """Fold, infer shapes again, fold again, until a round folds nothing: a folded value can
    make a shape further down static (Shape -> Gather -> Range -> ... -> Expand in YOLO-style
    anchor heads; Shape -> Slice -> Concat -> Reshape -> Squeeze in Paddle OCR), which only a
    new shape inference sees. Every round folds at least one node, so the count is bounded by
    the graph; the cap only guards against a fold that keeps re-creating work. Folds in
    place: ``model`` is changed and returned."""
    for _round in range(MAX_FOLD_ROUNDS):
        model, folded = fold_constants(model, info(model), in_place=True)
        if not folded:
            break
    return model


def import_onnx(source, input_shapes: dict[str, tuple[int, ...]] | None = None,
                dim_ranges: dict[str, tuple[int, int]] | None = None,
                bound: dict | None = None) -> ImportedModel:
    model, name = read_onnx(source)
    check_ops(model, name)
    if bound:
        model = bind_inputs(model, bound, name)
    inputs = graph_inputs(model)
    check_ranges(inputs, dim_ranges or {}, name)
    shapes = apply_overrides({t.name: t.shape for t in inputs}, input_shapes or {}, name)
    unknown = [n for n, s in shapes.items() if "?" in s]
    if unknown:
        raise ModelLoadError(f"{name}: input(s) {unknown} have unnamed dynamic dimensions; fix "
                             "them with --input-shape NAME=D1,D2,...")
    inputs = [TensorSpec(t.name, tuple(shapes[t.name]), t.dtype) for t in inputs]
    declared = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    model = prepare_for_tvm(model, shapes)
    from .onnx_importer import import_graph
    try:
        # Inputs with named dims are left out: the importer then makes them symbolic (tir.Var)
        # from the model's own dim_param; it rejects names given in shape_dict.
        fixed = {t.name: list(t.shape) for t in inputs if all(isinstance(d, int) for d in t.shape)}
        mod, ranges = import_graph(model, fixed, {t.name: carried_dtype(t.dtype) for t in inputs},
                                   dim_ranges or {})
    except AotcError:  # our own converters' named refusals pass through as they are
        raise
    except Exception as err:  # TVM's importer raises many kinds; say where it happened
        raise CompileError(f"{name}: TVM's ONNX importer failed: {type(err).__name__}: "
                           f"{meaningful_line(err)}") from err
    outputs = tuple(_as_declared(spec, declared.get(spec.name))
                    for spec in output_specs(mod, [o.name for o in model.graph.output]))
    return ImportedModel(mod, ModelSignature(tuple(inputs), outputs, ranges), name)


def check_ranges(inputs: list[TensorSpec], dim_ranges: dict, name: str) -> None:
    """--input-range names symbolic dims of the model's inputs, with 1 <= min <= max."""
    check_dim_names("--input-range", dim_ranges, inputs, name)
    for dim, (low, high) in dim_ranges.items():
        if not 1 <= low <= high:
            raise ModelLoadError(f"{name}: --input-range {dim}={low}:{high} is empty or below 1")


def bind_inputs(model: onnx.ModelProto, bound: dict, name: str) -> onnx.ModelProto:
    """The inputs named in ``bound`` become initializers holding those values (in the input's
    dtype and declared rank), so that shape folding and If inlining see constants."""
    specs = {t.name: t for t in graph_inputs(model)}
    unknown = sorted(set(bound) - set(specs))
    if unknown:
        raise ModelLoadError(f"{name}: --bind names unknown input(s) {unknown}; the model's "
                             f"inputs are {sorted(specs)}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for input_name, value in bound.items():
        spec = specs[input_name]
        array = np.asarray(value).astype(spec.dtype)
        if array.ndim != len(spec.shape) and array.size == 1:
            array = array.reshape([1] * len(spec.shape))
        if array.ndim != len(spec.shape) or any(
                isinstance(d, int) and d != a for d, a in zip(spec.shape, array.shape)):
            raise ModelLoadError(f"{name}: --bind {input_name}: a value of shape "
                                 f"{list(array.shape)} for an input of shape {list(spec.shape)}")
        kept = [v for v in out.graph.input if v.name != input_name]
        del out.graph.input[:]
        out.graph.input.extend(kept)
        out.graph.initializer.append(numpy_helper.from_array(array, input_name))
    return out


def _as_declared(spec: TensorSpec, elem_type: int | None) -> TensorSpec:
    """An output computed in bytes (int4, float8...: see onnx_lowbit) keeps its declared dtype
    in the signature; the runtime converts it back."""
    if elem_type not in CARRIED:
        return spec
    return TensorSpec(spec.name, spec.shape, _elem_dtype(elem_type))

"""What TVM's PyTorch importer converts wrongly or refuses, fixed on aotc's side.

- ``torch.cat`` with an empty 1-D tensor: torch skips such inputs (transformers' key/value
  cache starts as ``torch.tensor([])`` and is concatenated with 4-D keys); TVM's Concat
  refused the mixed ranks ("Concat expects all input tensors to have same ndim"). Empty inputs
  are dropped from the graph before the import; a cat left with one input becomes it.
- ``grid_sampler_2d``: torch's grid is [N, H, W, 2], TOPI's [N, 2, H, W]; TVM's converter
  passed torch's grid as it is and returned a wrong shape. Here the grid is transposed first,
  as TVM's ONNX GridSample converter does."""

from __future__ import annotations

from tvm import relax


def drop_empty_cat_inputs(program) -> int:
    """Rewrite ``program``'s graph in place; returns how many cat inputs were dropped."""
    dropped = 0
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or getattr(node.target, "__name__", "") != "cat.default":
            continue
        tensors = list(node.args[0])
        kept = [t for t in tensors if not _empty(t)]
        if len(kept) == len(tensors) or not kept:
            continue
        dropped += len(tensors) - len(kept)
        if len(kept) == 1:
            node.replace_all_uses_with(kept[0])
            graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])
    if dropped:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return dropped


def _empty(node) -> bool:
    value = getattr(node, "meta", {}).get("val")
    shape = getattr(value, "shape", None)
    return shape is not None and any(int(d) == 0 for d in shape if str(d).isdigit())


def grid_sampler_2d(node, importer) -> relax.Var:
    """aten.grid_sampler_2d(input, grid, interpolation, padding, align_corners)."""
    args = importer.retrieve_args(node)
    data, grid = args[0], args[1]
    method = {0: "bilinear", 1: "nearest", 2: "bicubic"}[args[2] if len(args) > 2 else 0]
    padding = {0: "zeros", 1: "border", 2: "reflection"}[args[3] if len(args) > 3 else 0]
    align = bool(args[4]) if len(args) > 4 else False
    grid = importer.block_builder.emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    return importer.block_builder.emit(relax.op.image.grid_sample(
        data, grid, method=method, layout="NCHW", padding_mode=padding, align_corners=align))


CUSTOM_CONVERTERS = {"grid_sampler_2d.default": grid_sampler_2d}

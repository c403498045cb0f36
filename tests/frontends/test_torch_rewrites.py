"""torch.cat with empty inputs and grid_sample on the torch.export path. Before: cat of an
empty 1-D tensor (transformers' key/value cache starts as ``torch.tensor([])``, so GPT-2 with
its default ``use_cache=True``) failed in TVM's importer ("Concat expects all input tensors to
have same ndim"); grid_sample was refused (TVM's converter passed torch's [N, H, W, 2] grid
where TOPI takes [N, 2, H, W])."""

import pytest
import torch
from helpers import check_against_torch

from aotc.compiler.frontends.torch_rewrites import drop_empty_cat_inputs


class EmptyCats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.tensor([]))

    def forward(self, x):
        grown = torch.cat([self.cache, x], dim=-2)  # a 1-D empty tensor beside 3-D ones
        tail = torch.cat([x, torch.zeros(0, 3, 4), x], dim=0)  # an empty 3-D one
        return grown * 2, tail


def test_graph_drops_the_empty_inputs():
    program = torch.export.export(EmptyCats(), (torch.randn(2, 3, 4),)).run_decompositions()
    cats = [n for n in program.graph.nodes if "cat" in str(n.target)]
    assert [len(n.args[0]) for n in cats] == [2, 3]
    assert drop_empty_cat_inputs(program) == 2
    cats = [n for n in program.graph.nodes if "cat" in str(n.target)]
    assert [len(n.args[0]) for n in cats] == [2]  # the first cat became its only input


def test_empty_cats_match_torch(tmp_path):
    check_against_torch(EmptyCats(), (torch.randn(2, 3, 4),), tmp_path)


def test_gpt2_with_its_cache_matches_torch(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000)
    assert config.use_cache
    gpt2 = transformers.GPT2LMHeadModel(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt2 = gpt2

        def forward(self, ids):
            return self.gpt2(input_ids=ids).logits
    check_against_torch(Logits(), (torch.randint(0, 1000, (1, 12)),), tmp_path)


class GridSample(torch.nn.Module):
    def __init__(self, mode, padding, align):
        super().__init__()
        self.options = {"mode": mode, "padding_mode": padding, "align_corners": align}

    def forward(self, x, grid):
        return torch.nn.functional.grid_sample(x, grid, **self.options)


@pytest.mark.parametrize("mode, padding, align", [
    ("bilinear", "zeros", False), ("nearest", "border", True), ("bilinear", "reflection", True)])
def test_grid_sample_matches_torch(tmp_path, mode, padding, align):
    torch.manual_seed(0)
    x, grid = torch.randn(2, 3, 7, 9), torch.rand(2, 5, 6, 2) * 2.4 - 1.2  # some outside
    check_against_torch(GridSample(mode, padding, align), (x, grid), tmp_path, atol=1e-5)

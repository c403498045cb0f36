"""Decoders exported the way generation runtimes take them: one ONNX graph that takes the
previous tokens' keys and values and returns them extended ("with past"), the form
onnxruntime-genai, Optimum and OpenVINO's GenAI run.

Inputs: ``input_ids`` [1, sequence_length] (int64), ``attention_mask`` [1,
total_sequence_length] (int64; ones), ``position_ids`` [1, sequence_length] (int64), then
``past_key_values.{layer}.key`` / ``.value`` [1, heads, past_sequence_length, head_dim].
Outputs: ``logits`` [1, sequence_length, vocabulary], then ``present.{layer}.key`` /
``.value`` [1, heads, total_sequence_length, head_dim]. A prompt runs with past length 0.

    path = export_gpt2("models/", layers=12)     # models/gpt2_with_past.onnx (GPT-2 small)
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

SEED = 0


class WithPast(nn.Module):
    """A transformers causal LM called with flat past tensors, returning logits and the flat
    present tensors (what an ONNX graph can carry)."""

    def __init__(self, model: nn.Module, layers: int, positions: bool = True):
        super().__init__()
        self.model, self.layers, self.positions = model, layers, positions

    def forward(self, input_ids, attention_mask, *rest):
        from transformers import DynamicCache
        position_ids, past = (rest[0], rest[1:]) if self.positions else (None, rest)
        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=True)
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def gpt2(layers: int = 12, heads: int = 12, width: int = 768, vocabulary: int = 50257,
         positions: int = 1024) -> nn.Module:
    """GPT-2 (small by default) with random weights from the fixed seed, in eval mode."""
    import transformers
    torch.manual_seed(SEED)
    config = transformers.GPT2Config(n_layer=layers, n_head=heads, n_embd=width,
                                     vocab_size=vocabulary, n_positions=positions,
                                     bos_token_id=vocabulary - 1, eos_token_id=vocabulary - 1,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).eval()


def input_names(layers: int, positions: bool = True) -> list[str]:
    return ["input_ids", "attention_mask"] + (["position_ids"] if positions else []) + [
        f"past_key_values.{layer}.{kind}" for layer in range(layers) for kind in ("key", "value")]


def output_names(layers: int) -> list[str]:
    return ["logits"] + [f"present.{layer}.{kind}" for layer in range(layers)
                         for kind in ("key", "value")]


def export_gpt2(folder: str | Path, layers: int = 12, heads: int = 12, width: int = 768,
                vocabulary: int = 50257, positions: bool = True) -> Path:
    """``folder/<name>.onnx`` (kept if present; ``gpt2_with_past`` for GPT-2 small, else a
    name with the sizes), exported by torch's TorchScript exporter with every length dynamic.
    ``positions=False``: no position_ids input (the model counts positions from the past
    length, as transformers does when none are given)."""
    small = (layers, heads, width, vocabulary) == (12, 12, 768, 50257)
    name = ("gpt2" if small else f"gpt2_l{layers}_h{heads}_w{width}_v{vocabulary}") + \
        ("_with_past" if positions else "_with_past_no_positions")
    path = Path(folder) / f"{name}.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    module = WithPast(gpt2(layers, heads, width, vocabulary), layers, positions).eval()
    past_length, length, head_dim = 5, 3, width // heads
    example = (torch.randint(0, vocabulary, (1, length)),
               torch.ones(1, past_length + length, dtype=torch.int64),
               *([torch.arange(past_length, past_length + length)[None]] if positions else []),
               *[torch.randn(1, heads, past_length, head_dim) for _ in range(2 * layers)])
    dims = {"input_ids": {1: "sequence_length"}, "position_ids": {1: "sequence_length"},
            "attention_mask": {1: "total_sequence_length"}, "logits": {1: "sequence_length"}}
    names = input_names(layers, positions)
    if not positions:
        del dims["position_ids"]
    dims.update({n: {2: "past_sequence_length"} for n in names if n.startswith("past")})
    dims.update({n: {2: "total_sequence_length"} for n in output_names(layers)[1:]})
    staging = path.with_suffix(".onnx.partial")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, str(staging), input_names=names,
                          output_names=output_names(layers), dynamic_axes=dims,
                          opset_version=17, dynamo=False)
    staging.replace(path)
    return path

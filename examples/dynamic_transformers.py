"""BERT and GPT-2 built by transformers from configs (random weights, no hub access), exported
to ONNX by torch's exporter with dynamic batch and sequence axes ("batch", "seq"), as users
export models that serve variable-length text.

    export("bert", "bert.onnx", hidden_size=64, num_hidden_layers=2)

Keyword arguments override the config (defaults: BERT-base, GPT-2 small)."""

from __future__ import annotations

from pathlib import Path

ARCHITECTURES = {
    # name -> (config class, model class, input names, output names)
    "bert": ("BertConfig", "BertModel", ["input_ids", "attention_mask", "token_type_ids"],
             ["last_hidden_state", "pooler_output"]),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", ["input_ids", "attention_mask"], ["logits"]),
}


def export(name: str, path: str | Path, **config) -> Path:
    import torch
    import transformers
    config_class, model_class, inputs, outputs = ARCHITECTURES[name]
    if name == "gpt2":
        config.setdefault("use_cache", False)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    args = tuple(torch.ones(2, 7, dtype=torch.int64) for _ in inputs)
    dynamic = {n: {0: "batch", 1: "seq"} for n in inputs}
    for output in outputs:
        dynamic[output] = {0: "batch"} if output == "pooler_output" else {0: "batch", 1: "seq"}
    torch.onnx.export(_positional(model.eval(), inputs, len(outputs)), args, str(path),
                      input_names=inputs, output_names=outputs, dynamic_axes=dynamic,
                      opset_version=17, dynamo=False)
    return Path(path)


def feed(input_names: list[str], batch: int, length: int, vocab: int, seed: int = 0) -> dict:
    """Token ids, an attention mask with padding at the end of the first row (so that a model
    ignoring its mask is caught), token types 0."""
    import numpy as np
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), np.int64)
    mask[0, length // 2 + 1:] = 0
    values = {"input_ids": rng.integers(0, vocab, (batch, length)), "attention_mask": mask,
              "token_type_ids": np.zeros((batch, length), np.int64)}
    return {n: values[n].astype(np.int64) for n in input_names}


def _positional(model, names: list[str], outputs: int):
    """The model with positional inputs, returning a tuple of its first ``outputs`` results
    (what torch's exporter traces)."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return tuple(self.model(**dict(zip(names, args)), return_dict=False)[:outputs])
    return Positional()

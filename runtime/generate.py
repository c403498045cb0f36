"""Greedy generation with the KV-cache entries of a decoder compiled with ``kv_capacity``
(compiler/kv_cache.py): the caches are allocated once, at the library's capacity, and the
``prefill`` and ``decode`` entries write into them in place."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from aotc.errors import InputMismatchError


def with_past_feed(generation: dict, tokens: np.ndarray, past: dict) -> dict:
    """Inputs of the model as exported (``main``): ``tokens`` after the ``past`` tensors
    (input name -> array), positions counted on from the past length, a mask of ones."""
    start = next(iter(past.values())).shape[generation["axis"]]
    feed = {generation["ids"]: np.asarray(tokens, dtype="int64").reshape(1, -1),
            generation["mask"]: np.ones((1, start + len(tokens)), "int64"), **past}
    if generation["positions"]:
        feed[generation["positions"]] = np.arange(start, start + len(tokens),
                                                  dtype="int64")[None]
    return feed


class CacheSession:
    """One sequence's caches and position. ``call(entry, args)`` runs an entry of the
    library; ``to_tensor``/``to_numpy`` convert between numpy and the runtime's tensors."""

    def __init__(self, generation: dict, call: Callable, to_tensor: Callable,
                 to_numpy: Callable):
        self.table, self._call = generation, call
        self._to_tensor, self._to_numpy = to_tensor, to_numpy
        self.capacity = int(generation["capacity"])
        self.caches = [to_tensor(np.zeros(c["shape"], c["dtype"]))
                       for c in generation["caches"]]
        self.length = 0  # tokens in the caches

    def _args(self, tokens: np.ndarray, mask: np.ndarray, start: int) -> dict:
        args = {self.table["ids"]: tokens[None].astype("int64"), self.table["mask"]: mask}
        if self.table["positions"]:
            args[self.table["positions"]] = np.arange(start, start + len(tokens),
                                                      dtype="int64")[None]
        return args

    def _run(self, entry: str, named: dict, extra: list) -> np.ndarray:
        caches = {c["input"]: t for c, t in zip(self.table["caches"], self.caches)}
        args = [caches[name] if name in caches else self._to_tensor(named[name])
                for name in self.table["inputs"]] + extra
        result = self._call(self.table["entries"][entry], args)
        return self._to_numpy(result[0])[0, -1]

    def prefill(self, tokens) -> np.ndarray:
        """Run a prompt from position 0 (earlier tokens are dropped); the last token's
        logits."""
        tokens = np.asarray(tokens, dtype="int64").reshape(-1)
        if not 0 < len(tokens) <= self.capacity:
            raise InputMismatchError(f"prompt of {len(tokens)} tokens; this library's KV "
                                     f"cache holds 1 to {self.capacity}")
        mask = np.ones((1, len(tokens)), "int64")
        logits = self._run("prefill", self._args(tokens, mask, 0), [])
        self.length = len(tokens)
        return logits

    def decode(self, token: int) -> np.ndarray:
        """Run one token after those in the caches; its logits."""
        if self.length == 0:
            raise InputMismatchError("decode before prefill: the caches are empty")
        if self.length >= self.capacity:
            raise InputMismatchError(f"the KV cache is full ({self.capacity} tokens)")
        mask = np.zeros((1, self.capacity), "int64")
        mask[0, :self.length + 1] = 1
        position = self._to_tensor(np.array([self.length], "int64"))
        logits = self._run("decode", self._args(np.array([token]), mask, self.length),
                           [position])
        self.length += 1
        return logits


@dataclass
class Generation:
    """Greedy output: the new tokens and their times."""
    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    first_token_ms: float = 0.0  # the prompt's prefill, to the first new token
    decode_ms: list[float] = field(default_factory=list)  # each later token

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens after the first, per second of decode steps."""
        total = sum(self.decode_ms)
        return len(self.decode_ms) / (total / 1e3) if total else 0.0

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
                "first_token_ms": round(self.first_token_ms, 3),
                "decode_ms_median": round(float(np.median(self.decode_ms)), 3)
                if self.decode_ms else None,
                "tokens_per_second": round(self.tokens_per_second, 2)}


def greedy(session: CacheSession, prompt, new_tokens: int, stop: int | None = None
           ) -> Generation:
    """Prefill ``prompt`` and pick the highest logit ``new_tokens`` times (or until
    ``stop``), within the cache's capacity."""
    prompt = np.asarray(prompt, dtype="int64").reshape(-1)
    if len(prompt) + new_tokens - 1 > session.capacity:
        raise InputMismatchError(f"{len(prompt)} prompt tokens + {new_tokens} new need "
                                 f"{len(prompt) + new_tokens - 1} cache positions; this "
                                 f"library's KV cache holds {session.capacity}")
    out = Generation(prompt_tokens=len(prompt))
    start = time.perf_counter()
    logits = session.prefill(prompt)
    token = int(np.argmax(logits))
    out.first_token_ms = (time.perf_counter() - start) * 1e3
    out.tokens.append(token)
    while len(out.tokens) < new_tokens and token != stop:
        start = time.perf_counter()
        token = int(np.argmax(session.decode(token)))
        out.decode_ms.append((time.perf_counter() - start) * 1e3)
        out.tokens.append(token)
    return out

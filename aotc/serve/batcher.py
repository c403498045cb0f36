"""Dynamic batching for one model: requests queue up to a delay and a row count, are stacked
along the model's symbolic batch dim, run once, and split back per request.

A sequence model's other symbolic dims (a length) never mix within a batch: requests are
grouped by size. When the library was compiled with buckets (``--buckets``), a request's
length is rounded up to its bucket and padded there, which the compiler has verified changes
no output (``compiler/buckets.verify_padding``); the outputs are cropped back to each
request's own length. Without buckets only requests of equal sizes share a run: padding an
unverified model could change its answers. A model whose inputs and outputs do not all start
with the same symbolic dim runs request by request.

The model runs on one thread of its own (TVM's thread pool belongs to the calling thread, and
a Model serializes its calls anyway); while a batch runs, the next one gathers."""

from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from aotc.runtime.model import check_inputs, crop_to, pad_to
from aotc.runtime.signature import ModelSignature


class Overloaded(RuntimeError):
    """The model's queue is full (answered 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ShuttingDown(Overloaded):
    pass


@dataclass(frozen=True)
class BatchSettings:
    """``max_batch``: rows (along the batch dim) per run; 1 (the default) runs request by
    request. On CPUs one request already keeps the cores busy: a batch saves per-row time
    only where rows share weight reads, and its requests wait for company and for each
    other (docs/results.md, "Serving"). So batching is opt-in: it raises the rate a model
    sustains near capacity at the cost of latency below it.
    ``max_delay_ms``: how long the first request of a batch waits for company.
    ``queue_limit``: requests waiting at most; more are refused with 503."""
    max_batch: int = 1
    max_delay_ms: float = 2.0
    queue_limit: int = 256

    def __post_init__(self):
        if self.max_batch < 1 or self.max_delay_ms < 0 or self.queue_limit < 1:
            raise ValueError(f"batching settings out of range: {self}")


@dataclass(eq=False)  # identity: a queue removes exactly this request
class _Pending:
    arrays: list[np.ndarray]
    bound: dict[str, int]
    key: tuple
    sizes: dict[str, int]
    rows: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class BatchPlan:
    """How a signature batches: its batch dim (None: it does not), its other symbolic dims and,
    per dim, the bucket sizes a length may be padded to."""
    batch_dim: str | None
    length_dims: tuple[str, ...]
    buckets: dict[str, tuple[int, ...]]

    @staticmethod
    def of(signature: ModelSignature, buckets: dict | None) -> BatchPlan:
        heads = {spec.shape[0] if spec.shape else None
                 for spec in (*signature.inputs, *signature.outputs)}
        batch_dim = next(iter(heads)) if len(heads) == 1 else None
        if not isinstance(batch_dim, str):
            batch_dim = None
        dims = [d for d in signature.dim_names() if d != batch_dim]
        outputs_known = all(not isinstance(d, str) or d == batch_dim or d in dims
                            for spec in signature.outputs for d in spec.shape)
        table = (buckets or {}).get("dims", {}) if outputs_known else {}
        return BatchPlan(batch_dim, tuple(dims),
                         {d: tuple(sorted(table[d])) for d in dims if d in table})

    def key(self, bound: dict[str, int]) -> tuple[tuple, dict[str, int]]:
        """(the group a request joins, the sizes it is padded to: bucketed dims only)."""
        sizes, key = {}, []
        for dim in self.length_dims:
            size = bound.get(dim, 0)
            fitting = [b for b in self.buckets.get(dim, ()) if b >= size]
            if fitting:
                sizes[dim] = fitting[0]
            key.append((dim, sizes.get(dim, size)))
        return tuple(key), sizes


class Batcher:
    """Queues requests for ``model`` (an ``aotc.runtime.Model``) and runs them in batches.
    ``observe(kind, model_name, value)`` receives queue seconds, compute seconds and batch
    sizes (the server's metrics)."""

    def __init__(self, name: str, model, settings: BatchSettings, observe=None):
        self.name, self.model, self.settings = name, model, settings
        self.signature: ModelSignature = model.signature
        self.plan = BatchPlan.of(self.signature, model.metadata.get("buckets"))
        if self.plan.batch_dim is None:
            self.settings = BatchSettings(1, 0.0, settings.queue_limit)
        self._observe = observe or (lambda *_args: None)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"aotc-{name}")

    @property
    def queued(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Refuse new requests, answer every queued one, stop."""
        self._closing = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs for one request. Raises InputMismatchError (the request does
        not fit the signature), Overloaded/ShuttingDown, or the model's own error."""
        if self._closing:
            raise ShuttingDown(f"model {self.name!r}: the server is shutting down", 1)
        if len(self._pending) >= self.settings.queue_limit:
            raise Overloaded(f"model {self.name!r}: {len(self._pending)} requests queued "
                             f"(limit {self.settings.queue_limit})", self._retry_after())
        arrays, bound = check_inputs(self.signature, inputs)
        key, sizes = self.plan.key(bound)
        rows = bound.get(self.plan.batch_dim, 1) if self.plan.batch_dim else 1
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(arrays, bound, key, sizes, rows, future))
        assert self._wakeup is not None, "Batcher.start() was not called"
        self._wakeup.set()
        return await future

    def _retry_after(self) -> int:
        return max(1, int(np.ceil(self.settings.max_delay_ms / 1e3 * 2)))

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            group = [self._pending[0]]
            try:
                group = await self._gather(group[0])
                for request in group:
                    self._pending.remove(request)
                await self._answer(group)
            except Exception as err:  # noqa: BLE001 - a request never waits forever
                for request in group:
                    if request in self._pending:
                        self._pending.remove(request)
                    if not request.future.done():
                        request.future.set_exception(err)

    async def _gather(self, first: _Pending) -> list[_Pending]:
        """The requests that run with ``first``: its group once full, or once it has waited
        the maximum delay (at once when shutting down)."""
        assert self._wakeup is not None
        deadline = first.enqueued + self.settings.max_delay_ms / 1e3
        while True:
            group = self._group(first)
            left = deadline - time.perf_counter()
            if sum(r.rows for r in group) >= self.settings.max_batch or left <= 0 \
                    or self._closing:
                return group
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except TimeoutError:
                pass

    def _group(self, first: _Pending) -> list[_Pending]:
        group: list[_Pending] = []
        rows = 0
        for request in self._pending:
            if request.key != first.key:
                continue
            if group and rows + request.rows > self.settings.max_batch:
                break
            group.append(request)
            rows += request.rows
        return group

    async def _answer(self, group: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        for request in group:
            self._observe("queue", self.name, start - request.enqueued)
        self._observe("batch", self.name, len(group))
        try:
            results = await loop.run_in_executor(self._executor, self._run_group, group)
        except Exception as err:  # noqa: BLE001 - every request gets the answer
            results = [err] * len(group)
        self._observe("compute", self.name, time.perf_counter() - start)
        for request, result in zip(group, results):
            if request.future.done():
                continue
            if isinstance(result, BaseException):
                request.future.set_exception(result)
            else:
                request.future.set_result(result)

    def _run_group(self, group: list[_Pending]) -> list:
        """Outputs (or the exception) per request. A batch that fails is run request by
        request, so that one bad request fails alone."""
        if len(group) == 1:
            return [self._run_one(group[0])]
        try:
            return self._run_stacked(group)
        except Exception:  # noqa: BLE001
            return [self._run_one(request) for request in group]

    def _run_one(self, request: _Pending):
        try:
            names = self.signature.input_names()
            return self.model.run(dict(zip(names, request.arrays)))
        except Exception as err:  # noqa: BLE001
            return err

    def _run_stacked(self, group: list[_Pending]) -> list[dict[str, np.ndarray]]:
        specs = self.signature.inputs
        stacked = {spec.name: np.concatenate([pad_to(r.arrays[k], spec, r.sizes)
                                              for r in group])
                   for k, spec in enumerate(specs)}
        outputs = self.model.run(stacked)
        out_specs = {spec.name: spec for spec in self.signature.outputs}
        answers, row = [], 0
        for request in group:
            part = {}
            for name, value in outputs.items():
                piece = value[row:row + request.rows]
                spec = out_specs.get(name)
                part[name] = crop_to(piece, spec, request.sizes, request.bound) \
                    if spec is not None and request.sizes else np.ascontiguousarray(piece)
            answers.append(part)
            row += request.rows
        return answers

"""Pipelines: a config-declared DAG of served models and small Python steps, served as one
model endpoint.

Each step maps its inputs from named tensors (the pipeline's inputs or earlier steps'
outputs) and names the tensors its outputs become. A step runs as soon as its inputs exist, so
independent branches run concurrently; model steps go through their model's batcher (a
pipeline's requests batch with direct requests to the same model); tensors stay numpy arrays
in memory between steps. Each step's latency is recorded in ``aotc_stage_seconds``.

A Python step names a function ``package.module:function`` that takes its inputs as keyword
arrays and returns a dict of arrays. It is imported when the server starts, like any code the
operator's config names; it runs on a worker thread, off the event loop."""

from __future__ import annotations

import asyncio
import importlib
import time
from dataclasses import dataclass, field

import numpy as np

from aotc.errors import AotcError, InputMismatchError, ModelRunError

from .batcher import Overloaded
from .tensors import datatype_of


@dataclass(frozen=True)
class Step:
    """``model`` (a served model's name) or ``function`` (``module:function``); ``inputs``:
    step input name -> tensor name; ``outputs``: step output name -> tensor name."""
    name: str
    inputs: dict[str, str]
    outputs: dict[str, str]
    model: str | None = None
    function: str | None = None


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...] = field(default_factory=tuple)
    version: str = "1"


class StepFailed(ModelRunError):
    """A step after the first failed: the pipeline's own fault, not the request's (500)."""


class ServedPipeline:
    def __init__(self, config: PipelineConfig, models: dict, observe_stage=None):
        self.config = config
        self.name, self.version = config.name, config.version
        self._models = models
        self._observe = observe_stage or (lambda *_args: None)
        self._functions = {s.name: _import(s.function, config.name, s.name)
                           for s in config.steps if s.function}
        self._check()

    def _check(self) -> None:
        where = f"pipeline {self.name!r}"
        produced = {t: "input" for t in self.config.inputs}
        names = [s.name for s in self.config.steps]
        if len(set(names)) != len(names):
            raise AotcError(f"{where}: step names repeat: {names}")
        for step in self.config.steps:
            if (step.model is None) == (step.function is None):
                raise AotcError(f"{where}: step {step.name!r} needs exactly one of 'model' "
                                "and 'function'")
            if step.model is not None:
                self._check_model_step(step, where)
            for tensor in step.outputs.values():
                if tensor in produced:
                    raise AotcError(f"{where}: tensor {tensor!r} is produced twice "
                                    f"({produced[tensor]} and step {step.name!r})")
                produced[tensor] = f"step {step.name!r}"
        for step in self.config.steps:
            missing = sorted(set(step.inputs.values()) - set(produced))
            if missing:
                raise AotcError(f"{where}: step {step.name!r} reads {missing}, which no input "
                                "or step produces")
        missing = sorted(set(self.config.outputs) - set(produced))
        if missing:
            raise AotcError(f"{where}: outputs {missing} are produced by no step")
        self._order_or_cycle(where)

    def _check_model_step(self, step: Step, where: str) -> None:
        served = self._models.get(step.model)
        if served is None:
            raise AotcError(f"{where}: step {step.name!r} runs model {step.model!r}, which "
                            f"is not served (models: {sorted(self._models)})")
        signature = served.signature
        wanted, given = set(signature.input_names()), set(step.inputs)
        if wanted != given:
            raise AotcError(f"{where}: step {step.name!r} maps inputs {sorted(given)}; model "
                            f"{step.model!r} takes {sorted(wanted)}")
        outputs = {s.name for s in signature.outputs}
        unknown = sorted(set(step.outputs) - outputs)
        if unknown:
            raise AotcError(f"{where}: model {step.model!r} has no output(s) {unknown} "
                            f"(it has {sorted(outputs)})")

    def _order_or_cycle(self, where: str) -> None:
        available, left = set(self.config.inputs), list(self.config.steps)
        while left:
            ready = [s for s in left if set(s.inputs.values()) <= available]
            if not ready:
                raise AotcError(f"{where}: steps {[s.name for s in left]} wait on each other "
                                "(a cycle)")
            for step in ready:
                left.remove(step)
                available |= set(step.outputs.values())

    # -- what a served endpoint offers -------------------------------------------------
    def input_names(self) -> list[str]:
        return list(self.config.inputs)

    def output_names(self) -> list[str]:
        return list(self.config.outputs)

    def _spec_of(self, tensor: str, reading: bool):
        for step in self.config.steps:
            if step.model is None:
                continue
            signature = self._models[step.model].signature
            pairs = step.inputs.items() if reading else step.outputs.items()
            specs = signature.inputs if reading else signature.outputs
            for port, name in pairs:
                if name == tensor:
                    return next(s for s in specs if s.name == port)
        return None

    def metadata(self) -> dict:
        def entry(tensor: str, reading: bool) -> dict:
            spec = self._spec_of(tensor, reading)
            if spec is None:  # read or made by Python steps only: known at run time
                return {"name": tensor, "datatype": "", "shape": [-1]}
            return {"name": tensor, "datatype": datatype_of(spec.dtype),
                    "shape": [d if isinstance(d, int) else -1 for d in spec.shape]}
        return {"name": self.name, "versions": [self.version], "platform": "aotc_pipeline",
                "inputs": [entry(t, True) for t in self.config.inputs],
                "outputs": [entry(t, False) for t in self.config.outputs]}


    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = set(self.config.inputs)
        if set(inputs) != expected:
            raise InputMismatchError(
                f"inputs do not match pipeline {self.name!r}: missing "
                f"{sorted(expected - set(inputs))}, unknown {sorted(set(inputs) - expected)}; "
                f"expected {sorted(expected)}")
        values = dict(inputs)
        left = list(self.config.steps)
        running: dict[asyncio.Future, Step] = {}
        while left or running:
            for step in [s for s in left if set(s.inputs.values()) <= set(values)]:
                left.remove(step)
                running[asyncio.ensure_future(self._run_step(step, values))] = step
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                running.pop(task)
                values.update(task.result())
        return {name: values[name] for name in self.config.outputs}

    async def _run_step(self, step: Step, values: dict) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        args = {port: values[tensor] for port, tensor in step.inputs.items()}
        first = set(step.inputs.values()) <= set(self.config.inputs)
        try:
            if step.model is not None:
                outputs = await self._models[step.model].infer(args)
            else:
                loop = asyncio.get_running_loop()
                outputs = await loop.run_in_executor(
                    None, lambda: self._functions[step.name](**args))
                if not isinstance(outputs, dict) or set(step.outputs) - set(outputs):
                    raise TypeError(f"returned {type(outputs).__name__} without outputs "
                                    f"{sorted(set(step.outputs) - set(outputs or {}))}")
        except Overloaded:
            raise  # 503: the client may retry
        except Exception as err:
            if first and isinstance(err, AotcError):
                raise  # the request's own inputs do not fit the first models: 400
            raise StepFailed(f"pipeline {self.name!r}, step {step.name!r}: "
                             f"{type(err).__name__}: {err}") from err
        finally:
            self._observe(self.name, step.name, time.perf_counter() - start)
        return {tensor: np.asarray(outputs[port]) for port, tensor in step.outputs.items()}


def _import(reference: str | None, pipeline: str, step: str):
    module, _, attribute = (reference or "").partition(":")
    if not module or not attribute:
        raise AotcError(f"pipeline {pipeline!r}, step {step!r}: function {reference!r} must "
                        "be 'module:function'")
    try:
        function = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise AotcError(f"pipeline {pipeline!r}, step {step!r}: cannot import "
                        f"{reference!r}: {err}") from None
    if not callable(function):
        raise AotcError(f"pipeline {pipeline!r}, step {step!r}: {reference!r} is not callable")
    return function

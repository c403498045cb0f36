"""A loaded model: checks inputs against the signature, runs the Relax VM, returns numpy."""

from __future__ import annotations

import functools
import platform
import tempfile
import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TypeVar

import numpy as np

from aotc import settings
from aotc.errors import ArtifactError, InputMismatchError, ModelRunError, meaningful_line

from . import encrypted, forks, generate, loops
from ._tvm_runtime import tvm_ffi
from .artifact import read_metadata
from .buffers import TVM_ALIGNMENT, aligned_empty
from .devices import DEVICES
from .exotic_dtypes import to_numpy, to_tvm
from .parallelism import Parallelism
from .signature import ModelSignature, TensorSpec
from .thread_placement import PLACEMENT

T = TypeVar("T")


class Model:
    """A compiled aotc model. Call it with numpy arrays by input name (or positionally).

    Thread-safe: the Relax VM keeps its registers in the VM object, so calls from several
    threads on one Model are serialized by a lock. For parallel throughput, load one Model per
    thread (each has its own VM; TVM's thread pools are per calling thread)."""

    def __init__(self, path: str | Path, verify: bool = True, key_file=None):
        self.path = Path(path)
        memory = encrypted.open_encrypted(self.path, key_file) \
            if encrypted.is_encrypted(self.path) else None
        try:
            self._init(memory.path if memory else self.path, verify)
        finally:
            if memory is not None:
                memory.close()  # the loaded library stays mapped; no copy remains

    def _init(self, library: Path, verify: bool) -> None:
        """Load from ``library``: the file, or the decrypted copy in memory."""
        self.metadata = read_metadata(library, verify=verify)
        self.signature = ModelSignature.from_json(self.metadata["signature"])
        _check_runs_here(self.path, self.metadata["target"])
        self.device = DEVICES[self.metadata["target"].get("device", "cpu")]
        settings.apply_thread_setting()
        ffi = tvm_ffi()
        loops.register(ffi)  # before the VM starts: it resolves its functions then
        try:
            self.device.load_runtime()
        except ArtifactError as err:
            raise ArtifactError(f"{self.path}: {err}") from None
        try:
            self._lib = _load_by_content(ffi, library, self.metadata["hash"])
            self._vm = self._lib["vm_load_executable"]()
        except Exception as err:
            raise ArtifactError(f"{self.path}: TVM runtime could not load it: {err}") from None
        try:
            self._vm["vm_initialization"](*self.device.vm_initialization_args())
        except RuntimeError as err:  # e.g. CUDA: no GPU, or a driver older than the runtime
            raise ArtifactError(f"{self.path}: cannot start the {self.device.name} device: "
                                f"{meaningful_line(err)}") from None
        self._entries = {"main": self._vm["main"]}
        self._buckets = self.metadata.get("buckets")
        # a decoder's past length is 0 before its first token
        generation = self.metadata.get("generation")
        self._empty_ok = {generation["past_dim"]} if generation else frozenset()
        self._ffi = ffi
        self._lock = threading.Lock()
        forks.track_lock(self)
        self._staging = InputStaging()
        self._outputs: dict[int, tuple[list[str], list[str | None]]] = {}
        self._threads = settings.thread_count() if self.device.is_host else 1
        self._parallelism = Parallelism(self._threads, settings.PARALLELISM.get())

    @property
    def target(self) -> dict:
        return self.metadata["target"]

    @property
    def ffi(self):
        """The tvm_ffi module the model runs on (to build its tensors)."""
        return self._ffi

    def kernel(self, name: str):
        """One kernel of the library as a callable (the profiler times them one by one), or
        None. Kernels live in the library module the VM executable imports."""
        try:
            return self._lib.get_function(name, query_imports=True)
        except AttributeError:  # tvm_ffi's "Module has no function"
            return None

    def __call__(self, *args: np.ndarray, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        if args:
            if len(args) > len(self.signature.inputs):
                raise InputMismatchError(f"{len(args)} positional inputs given, model takes "
                                         f"{len(self.signature.inputs)}")
            inputs = {**dict(zip(self.signature.input_names(), args)), **inputs}
        return self.run(inputs)

    def run(self, inputs: dict[str, np.ndarray], entry: str | None = None
            ) -> dict[str, np.ndarray]:
        """Run once; returns {output name: array}. A library built with buckets runs the
        smallest bucket that fits (inputs padded, outputs cropped) where that pays;
        ``entry`` forces an entry: ``"main"`` (the symbolic one) or a bucket's."""
        arrays, bound = check_inputs(self.signature, inputs, self._empty_ok)
        name, sizes = self._bucket_for(bound) if entry is None else self._entry(entry, bound)
        if not sizes:
            return self._run_entry(name, arrays)
        arrays = [pad_to(a, spec, sizes) for a, spec in zip(arrays, self.signature.inputs)]
        outputs = self._run_entry(name, arrays)
        specs = {o.name: o for o in self.signature.outputs}
        return {k: crop_to(v, specs[k], sizes, bound) if k in specs else v
                for k, v in outputs.items()}

    def _entry(self, name: str, bound: dict[str, int]) -> tuple[str, dict[str, int]]:
        """``name`` and, for a bucket's entry, the sizes it pads to (which must fit)."""
        buckets = self._buckets or {"entries": {}}
        key = next((k for k, v in buckets["entries"].items() if v == name), None)
        if key is None:
            return name, {}
        sizes = dict(buckets["sizes"][key])
        if any(bound.get(d, 0) > size for d, size in sizes.items()):
            raise InputMismatchError(f"{self.path.name}: the inputs ({bound}) do not fit the "
                                     f"bucket {sizes} of entry {name!r}")
        return name, sizes

    def _bucket_for(self, bound: dict[str, int]) -> tuple[str, dict[str, int]]:
        """The smallest bucket that fits, unless it pads more than the symbolic entry costs
        over it (compiler/buckets.symbolic_costs, measured at compile time): then the
        symbolic entry, at the call's own size."""
        if not self._buckets:
            return "main", {}
        sizes = {}
        for dim, options in self._buckets["dims"].items():
            fitting = [size for size in options if size >= bound.get(dim, 0)]
            if dim not in bound or not fitting:
                return "main", {}
            sizes[dim] = min(fitting)
        key = ",".join(f"{k}={v}" for k, v in sorted(sizes.items()))
        cost = self._buckets.get("symbolic_cost", {}).get(key)
        padding = float(np.prod([sizes[d] / bound[d] for d in sizes]))
        if cost is not None and padding > cost:
            return "main", {}
        return self._buckets["entries"][key], sizes

    def _run_entry(self, name: str, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            tensors = [self._staging.tensor(i, a, self._ffi) for i, a in enumerate(arrays)]
            outputs = self._call_unlocked(name, tensors)
            # an output that is an input (an identity model) must not be the staging buffer
            # the next run overwrites
            return {name: self._staging.detached(to_numpy(self._ffi, out, want))
                    for name, want, out in zip(*self._output_specs(len(outputs)), outputs)}

    def _output_specs(self, count: int) -> tuple[list[str], list[str | None]]:
        """Names and signature dtypes of ``count`` outputs (those past the signature's are
        named by position), made once per count."""
        specs = self._outputs.get(count)
        if specs is None:
            declared = list(self.signature.outputs)
            names = [o.name for o in declared] + [f"output{i}"
                                                  for i in range(len(declared), count)]
            wants = [o.dtype for o in declared] + [None] * (count - len(declared))
            specs = self._outputs[count] = (names, wants)
        return specs

    def call_entry(self, name: str, tensors: list) -> list:
        """Run entry ``name`` of the library on runtime tensors (``tensor``); its outputs as
        runtime tensors, on the host. No signature check: for callers that built the
        arguments from the library's metadata (generation with a KV cache)."""
        with self._lock:
            return self._call_unlocked(name, tensors)

    def tensor(self, array: np.ndarray):
        """A runtime tensor holding a 64-byte-aligned copy of ``array``."""
        if array.size == 0:
            return to_tvm(self._ffi, _compact_empty(array))
        buffer = aligned_empty(array.shape, array.dtype)
        np.copyto(buffer, array)
        return to_tvm(self._ffi, buffer)

    def generate(self, prompt, new_tokens: int, stop: int | None = None):
        """Greedy generation through the library's KV-cache entries (a decoder compiled with
        ``kv_capacity``): ``prompt`` token ids in, a ``Generation`` (the new tokens, time to
        the first, per-token decode times) out. Each call starts a new sequence."""
        return generate.greedy(self.cache_session(), prompt, new_tokens, stop)

    def generation_logits(self, tokens, prompt_length: int) -> np.ndarray:
        """Teacher-forced: prefill ``tokens[:prompt_length]``, then decode each later token;
        the logits after each step, one row per step (for checking a library against
        another engine token by token)."""
        tokens = np.asarray(tokens, dtype="int64").reshape(-1)
        session = self.cache_session()
        rows = [session.prefill(tokens[:prompt_length])]
        rows += [session.decode(int(t)) for t in tokens[prompt_length:]]
        return np.stack(rows)

    def cache_session(self):
        """A sequence's caches, allocated once at the library's capacity, for stepping by
        hand (``prefill``, then ``decode`` token by token)."""
        table = self.metadata.get("generation")
        if table is None:
            raise ModelRunError(f"{self.path.name}: compiled without a KV cache; compile the "
                                "decoder with --kv-capacity N to generate")
        return generate.CacheSession(table, self.call_entry, self.tensor,
                                     lambda t: to_numpy(self._ffi, t))

    def _call_unlocked(self, name: str, tensors: list) -> list:
        function = self._entries.get(name)
        if function is None:
            function = self._entries[name] = self._vm[name]
        try:
            if not self.device.is_host:
                tensors = [self.device.upload(t) for t in tensors]
            size = (name, *(tuple(t.shape) for t in tensors)) if self._parallelism.enabled \
                else ()
            result = self._parallelism.run(lambda: function(*tensors),
                                           pool_work=self._pool_work(function, tensors),
                                           size=size)
        except (RuntimeError, IndexError, ValueError, TypeError) as err:
            # Raised by a kernel's own check (e.g. an index out of range; see GuardIndices).
            raise ModelRunError(f"{self.path.name}: {type(err).__name__}: "
                                f"{meaningful_line(err)}") from None
        outputs = list(result) if not hasattr(result, "__dlpack__") else [result]
        if not self.device.is_host:
            outputs = [self.device.download(o) for o in outputs]
        return outputs

    def _starts_pool(self) -> bool:
        """Whether this model's kernels start a CPU thread pool (not with one thread, nor on a
        device that is not the host)."""
        return self.device.is_host and self._threads >= 2

    def on_kernel_thread(self, work: Callable[[], T]) -> T:
        """``work()`` where this model's pooled runs happen: this thread's kernel thread
        (runtime/forks.py), or this thread where no CPU pool starts. For callers that call the
        library's kernels themselves (the profiler)."""
        return forks.run_pooled(work) if self._starts_pool() else work()

    def _pool_work(self, function, tensors: list):
        """The run in pool mode: on this thread's kernel thread, where TVM's pool lives
        (runtime/forks.py), placed around the pool's workers. None where no CPU pool starts:
        the run stays on this thread."""
        if not self._starts_pool():
            return None
        return lambda: forks.run_pooled(lambda: PLACEMENT.run(lambda: function(*tensors)))


class InputStaging:
    """64-byte-aligned buffers for inputs that are not, one per input position, kept between
    runs: numpy allocates large arrays 16 bytes past a page boundary, so nearly every input
    needs one, and a fresh buffer per run would pay its page faults each time. Used under the
    model's lock."""

    def __init__(self):
        self._buffers: dict[int, np.ndarray] = {}

    def tensor(self, position: int, array: np.ndarray, ffi):
        """The runtime tensor for input ``position``: a view of ``array`` where its data is
        aligned (read from the tensor: numpy's ``ctypes.data`` costs microseconds), else of
        its staged copy."""
        tensor = to_tvm(ffi, array)
        if array.size == 0 or tensor.data_ptr() % TVM_ALIGNMENT == 0:
            return tensor
        return to_tvm(ffi, self._staged(position, array))

    def _staged(self, position: int, array: np.ndarray) -> np.ndarray:
        buffer = self._buffers.get(position)
        if buffer is None or buffer.shape != array.shape or buffer.dtype != array.dtype:
            buffer = aligned_empty(array.shape, array.dtype)
            self._buffers[position] = buffer
        np.copyto(buffer, array)
        return buffer

    def detached(self, output: np.ndarray) -> np.ndarray:
        """``output``, or a copy of it when it lies in a staging buffer."""
        if any(np.shares_memory(output, b) for b in self._buffers.values()):
            return output.copy()
        return output


def _check_runs_here(path: Path, target: dict) -> None:
    """Refuse, before dlopen, a library built for another machine or device (dlopen of an
    aarch64 .so on x86 says only "wrong ELF class")."""
    arch = target.get("arch", "x86_64")  # models built before targets carried it were x86
    if arch != platform.machine():
        raise ArtifactError(f"{path}: built for {arch} (target {target['name']}); this machine "
                            f"is {platform.machine()}. Run it on {arch}, or package it "
                            f"(aotc package) and run bin/aotc-run under an emulator")
    if arch == "x86_64":
        _check_cpu_flags(path, target)
    if target.get("device", "cpu") not in DEVICES:
        raise ArtifactError(f"{path}: a {target['device']} model; this runtime runs "
                            f"{', '.join(DEVICES)} models")


def _check_cpu_flags(path: Path, target: dict) -> None:
    """Refuse a library whose code uses instructions this CPU lacks: an AVX-512 build on an
    AVX2 machine would die with SIGILL at its first such instruction, mid-run."""
    from aotc.targets import cpu_flags_needed, x86

    needed = target.get("cpu_flags")
    if needed is None:  # built before the metadata listed them
        needed = cpu_flags_needed(target.get("tvm", {}))
    lacking = x86.lacking_flags(needed)
    if lacking:
        mcpu = target.get("tvm", {}).get("mcpu", "?")
        raise ArtifactError(
            f"{path}: built for target {target['name']} (mcpu={mcpu}), whose code uses "
            f"{', '.join(sorted(needed))}; this CPU lacks {', '.join(sorted(lacking))}. Compile "
            f"it for this machine (--target x86) or for a preset this CPU has (aotc targets)")
    if "amx_tile" in needed and not x86.request_amx():
        raise ArtifactError(
            f"{path}: its kernels use AMX tiles, and Linux refused this process the AMX state "
            "(arch_prctl ARCH_REQ_XCOMP_PERM; a seccomp filter or an old kernel). Compile it "
            "for a target without AMX (--target x86-bf16)")


def _load_by_content(ffi, path: Path, digest: str):
    """dlopen the library under a name unique to its content.

    dlopen returns the already-loaded library for a path it has seen, so a model recompiled
    to the same path and loaded again in one process ran the old code (a silent wrong answer;
    found with two torch models written to one path in turn). A symlink named by the file's
    SHA-256 makes a new build a new library and the same build the same one. The path is
    absolute: dlopen reads a bare "model.so" as a library name to search for. The link lives
    in a folder of its own, removed as soon as dlopen has mapped the library: a folder kept
    for the process's life was left behind by every process that ended without running its
    atexit handlers (killed workers, forked children leaving by ``os._exit``), and two
    threads loading one model raced over a shared link."""
    with tempfile.TemporaryDirectory(prefix="aotc-runtime-") as folder:
        link = Path(folder) / f"{digest[:40]}.so"
        link.symlink_to(path.absolute())  # not resolved: a decrypted model's /proc fd link
        return ffi.load_module(str(link))


def check_inputs(signature: ModelSignature, inputs: dict,
                 empty_ok: AbstractSet[str] = frozenset()
                 ) -> tuple[list[np.ndarray], dict[str, int]]:
    """Inputs in signature order, contiguous and native (not necessarily 64-byte aligned:
    InputStaging sees to that), and the size each symbolic dim took; any mismatch raises with
    expected vs. got. Symbolic dims are at least 1, but those in ``empty_ok`` (a decoder's
    past length: 0 before the first token) may be 0."""
    if len(inputs) != len(signature.inputs) or \
            not all(spec.name in inputs for spec in signature.inputs):
        expected = signature.input_names()
        missing = [n for n in expected if n not in inputs]
        unknown = [n for n in inputs if n not in expected]
        raise InputMismatchError(f"inputs do not match the model: missing {missing}, unknown "
                                 f"{unknown}; expected {expected}")
    bound: dict[str, int] = {}
    arrays = [_check_one(spec, inputs[spec.name], bound, empty_ok) for spec in signature.inputs]
    for dim, (low, high) in signature.dim_ranges.items():
        if dim in bound and not low <= bound[dim] <= high:
            raise InputMismatchError(f"dim {dim!r} is {bound[dim]}; this model takes "
                                     f"{low} to {high}")
    return arrays, bound


def pad_to(array: np.ndarray, spec: TensorSpec, sizes: dict[str, int]) -> np.ndarray:
    """Zeros after the data along the bucketed dims (the bucket's size); only sizes a library
    verified at compile time (its buckets) may be padded to."""
    widths = [(0, sizes[d] - n if isinstance(d, str) and d in sizes else 0)
              for d, n in zip(spec.shape, array.shape)]
    return np.pad(array, widths) if any(w for _, w in widths) else array


def crop_to(array: np.ndarray, spec: TensorSpec, sizes: dict[str, int],
            bound: dict[str, int]) -> np.ndarray:
    """``array`` (an output of ``spec``) cut back along the padded dims to their sizes in
    ``bound``."""
    if array.ndim != len(spec.shape):
        return array
    cut = tuple(slice(0, bound[d]) if isinstance(d, str) and d in sizes else slice(None)
                for d in spec.shape)
    return np.ascontiguousarray(array[cut])


def _check_one(spec: TensorSpec, value, bound: dict[str, int], empty_ok=frozenset()
               ) -> np.ndarray:
    value = _as_array(spec, value)
    dtype = _numpy_dtype(spec.dtype)
    if (dtype is None or value.dtype != dtype) and value.dtype.name != spec.dtype:
        # .name: big-endian float32 is still "float32"
        raise InputMismatchError(f"input {spec.name!r}: expected dtype {spec.dtype}, got "
                                 f"{value.dtype.name}")
    if value.shape != spec.shape and (value.ndim != len(spec.shape) or not all(
            _dim_matches(want, got, bound, empty_ok)
            for want, got in zip(spec.shape, value.shape))):  # equal: a static shape
        raise InputMismatchError(f"input {spec.name!r}: expected shape "
                                 f"{list(spec.shape)}, got {list(value.shape)}")
    return _native_writable(value)


@functools.cache
def _numpy_dtype(name: str) -> np.dtype | None:
    """numpy's dtype named ``name``, or None (bfloat16 and other ml_dtypes types, unless
    imported): comparing dtypes is fast, ``dtype.name`` is computed in Python."""
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _as_array(spec: TensorSpec, value) -> np.ndarray:
    """numpy arrays as they are; numpy scalars (and Python numbers, for rank-0 inputs) as 0-d
    arrays of the input's dtype."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if not spec.shape and isinstance(value, (bool, int, float)):
        return np.asarray(value, dtype=spec.dtype)
    raise InputMismatchError(f"input {spec.name!r}: expected a numpy array, got "
                             f"{type(value).__name__}")


def _native_writable(value: np.ndarray) -> np.ndarray:
    """A C-contiguous, native-endian array DLPack can export. numpy refuses to export read-only
    arrays (np.frombuffer, memory-mapped np.load, onnx's numpy_helper), and DLPack has no byte
    order: those are copied. The kernels never write their inputs."""
    if not value.dtype.isnative:
        value = value.astype(value.dtype.newbyteorder("="))
    if not value.flags.c_contiguous or not value.flags.writeable:
        value = value.copy(order="C")  # not np.ascontiguousarray: it turns 0-d arrays into 1-d
    if value.size == 0:
        value = _compact_empty(value)
    return value


def _compact_empty(value: np.ndarray) -> np.ndarray:
    """An empty array with the strides TVM calls compact (each the product of the dims after
    it, in bytes): numpy gives empty arrays other strides, which TVM rejects ("expected to be
    compact array")."""
    strides: list[int] = []
    step = value.dtype.itemsize
    for dim in reversed(value.shape):
        strides.insert(0, step)
        step *= dim
    # np.ndarray, not as_strided: that goes through __array_interface__ and turns ml_dtypes
    # types (float8...) into an unreadable '<f1'
    return np.ndarray(value.shape, value.dtype, buffer=np.empty(1, value.dtype),
                      strides=tuple(strides))


def _dim_matches(want, got: int, bound: dict[str, int], empty_ok=frozenset()) -> bool:
    if isinstance(want, int):
        return want == got
    return bound.setdefault(want, got) == got and (got > 0 or want in empty_ok)

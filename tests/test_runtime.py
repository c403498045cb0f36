"""The runtime: input checks, integrity check, and that it stays free of the compiler."""

import os
import subprocess
import sys

import numpy as np
import pytest

import aotc
from aotc.errors import ArtifactError, InputMismatchError


@pytest.fixture(scope="module")
def model(tiny_so):
    return aotc.load(tiny_so)


def test_signature_is_embedded(model):
    sig = model.signature
    assert [(t.name, t.shape, t.dtype) for t in sig.inputs] == [("x", (1, 8, 12, 12), "float32")]
    assert [(t.name, t.shape) for t in sig.outputs] == [("y", (1, 10))]
    assert model.metadata["versions"]["apache-tvm"] == "0.27.0.post1"


def test_call_styles_agree(model):
    x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
    a, b, c = model(x)["y"], model(x=x)["y"], model.run({"x": x})["y"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("feed, message", [
    ({"x": np.zeros((1, 8, 12, 11), np.float32)},
     r"expected shape \[1, 8, 12, 12\], got \[1, 8, 12, 11\]"),
    ({"x": np.zeros((1, 8, 12, 12), np.float64)}, "expected dtype float32, got float64"),
    ({"y": np.zeros((1, 8, 12, 12), np.float32)}, r"missing \['x'\], unknown \['y'\]"),
    ({"x": [[1.0]]}, "expected a numpy array, got list"),
])
def test_wrong_inputs_say_expected_vs_got(model, feed, message):
    with pytest.raises(InputMismatchError, match=message):
        model.run(feed)


def test_non_contiguous_input_is_accepted(model):
    x = np.random.default_rng(0).standard_normal((1, 8, 12, 24)).astype(np.float32)[..., ::2]
    np.testing.assert_allclose(model(x=x)["y"], model(x=np.ascontiguousarray(x))["y"])


def test_unaligned_input_is_realigned(tmp_path):
    """TVM's kernels use 64-byte-aligned vector loads on their arguments; numpy guarantees only
    16. Without realignment this Relu segfaulted every time, so it runs in a subprocess: a
    regression fails this test instead of killing the test run."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "relu.onnx")
    aotc.compile(tmp_path / "relu.onnx", output=tmp_path / "relu.so")
    code = (
        "import numpy as np, aotc\n"
        f"m = aotc.load({str(tmp_path / 'relu.so')!r})\n"
        "x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)\n"
        "raw = np.zeros(x.nbytes + 64, np.uint8)\n"
        "start = 4 + (-raw.ctypes.data % 64)\n"
        "u = raw[start:start + x.nbytes].view(np.float32).reshape(x.shape)\n"
        "u[...] = x\n"
        "assert u.ctypes.data % 64 == 4\n"
        "np.testing.assert_array_equal(m(x=u)['y'], np.maximum(x, 0))\n"
        "print('OK')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]


def _unaligned_copy(x: np.ndarray) -> np.ndarray:
    raw = np.zeros(x.nbytes + 64, np.uint8)
    start = 16 + (-raw.ctypes.data % 64)  # where numpy puts large arrays: 16 past a page
    u = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    u[...] = x
    return u


@pytest.mark.in_process
def test_unaligned_inputs_reuse_one_staging_buffer_and_outputs_stay_theirs(tmp_path):
    """Unaligned inputs are copied into one aligned buffer per input, kept between runs. A
    model whose output is its input (Identity) would hand back that buffer: each result is
    still the run's own, not overwritten by the next run."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["z"])],
        "identity", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 64]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [32, 64])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "identity.onnx")
    aotc.compile(tmp_path / "identity.onnx", output=tmp_path / "identity.so")
    model = aotc.load(tmp_path / "identity.so")
    rng = np.random.default_rng(0)
    first, second = (rng.standard_normal((32, 64)).astype(np.float32) for _ in range(2))
    out1 = model(x=_unaligned_copy(first))
    (buffer,) = model._staging._buffers.values()
    out2 = model(x=_unaligned_copy(second))
    assert next(iter(model._staging._buffers.values())) is buffer  # reused, not reallocated
    np.testing.assert_array_equal(out1["y"], first)
    np.testing.assert_array_equal(out1["z"], np.maximum(first, 0))
    np.testing.assert_array_equal(out2["y"], second)


def test_tampered_library_is_refused(tiny_so, tmp_path):
    data = bytearray(tiny_so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "tampered.so"
    bad.write_bytes(data)
    with pytest.raises(ArtifactError, match="integrity check failed"):
        aotc.load(bad)


def test_foreign_library_is_refused(tmp_path):
    fake = tmp_path / "fake.so"
    fake.write_bytes(b"\x7fELF" + b"\0" * 100)
    with pytest.raises(ArtifactError, match="not a library built by aotc"):
        aotc.load(fake)


def test_runtime_imports_no_compiler(tiny_so):
    code = (
        "import sys, numpy as np\n"
        "from aotc.runtime import load\n"
        f"m = load({str(tiny_so)!r})\n"
        "m(x=np.zeros((1, 8, 12, 12), np.float32))\n"
        "heavy = [k for k in ('tvm', 'onnx', 'torch', 'xgboost', 'aotc.compiler', 'aotc.schedules')"
        " if k in sys.modules]\n"
        "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_loading_leaves_no_folder_behind_and_threads_may_load_one_model_at_once(tiny_so,
                                                                               tmp_path):
    """The content-named link dlopen reads is removed once loaded, also in a process that
    leaves by os._exit (a forked server's child; no atexit handlers run) and while four
    threads load the same library at once."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    code = (
        "import os, threading, numpy as np\n"
        "from aotc.runtime import load\n"
        "x = np.ones((1, 8, 12, 12), np.float32)\n"
        "outs, errors = [], []\n"
        "def one():\n"
        "    try:\n"
        f"        outs.append(next(iter(load({str(tiny_so)!r})(x=x).values())))\n"
        "    except Exception as err:\n"
        "        errors.append(repr(err))\n"
        "threads = [threading.Thread(target=one) for _ in range(4)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print('ERRORS', errors, 'SAME', all(np.array_equal(o, outs[0]) for o in outs),\n"
        "      len(outs), flush=True)\n"
        "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "TMPDIR": str(scratch)})
    assert "ERRORS [] SAME True 4" in out.stdout, out.stdout + out.stderr
    assert list(scratch.iterdir()) == []


def test_default_thread_count_is_every_allowed_core(tiny_so):
    """TVM's pool halves the core count on x86 (it assumes hyper-threads): users got one thread
    of two here. Checked in a fresh process with neither thread variable set."""
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "AOTC_NUM_THREADS")}
    code = (
        "import os, numpy as np\n"
        "from aotc.runtime import load\n"
        "from aotc.runtime._tvm_runtime import num_threads\n"
        f"load({str(tiny_so)!r})(x=np.zeros((1, 8, 12, 12), np.float32))\n"
        "print('THREADS', num_threads(), len(os.sched_getaffinity(0)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    threads, cores = out.stdout.split("THREADS")[1].split()
    assert threads == cores, out.stdout


def test_asking_the_thread_count_first_keeps_every_core():
    """Asking the pool's size before any model ran started TVM's pool with its own default
    (one thread here), which pinned the caller to core 0, and every child process inherited
    that: bench/bench_models.py timed all its engines on one core. In a fresh process."""
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "AOTC_NUM_THREADS")}
    code = ("import os\n"
            "allowed = os.sched_getaffinity(0)\n"
            "from aotc.runtime._tvm_runtime import num_threads\n"
            "print('THREADS', num_threads(), len(allowed), os.sched_getaffinity(0) == allowed)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    threads, cores, kept = out.stdout.split("THREADS")[1].split()
    assert threads == cores and kept == "True", out.stdout


def test_calling_thread_keeps_off_the_pinned_worker_cores(tiny_so):
    """In a fresh process: after the first run the placement knows the cores TVM's workers
    do not use, later runs happen there, and the caller's own affinity is restored."""
    import subprocess
    import sys
    script = f"""
import os, numpy as np, aotc
from aotc.runtime.thread_placement import PLACEMENT
model = aotc.load({str(tiny_so)!r})
allowed = os.sched_getaffinity(0)
x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
first = model(x=x)["y"]
for _ in range(3):
    assert np.array_equal(model(x=x)["y"], first)
assert os.sched_getaffinity(0) == allowed, "affinity not restored"
if len(allowed) >= 2 and os.environ.get("TVM_NUM_THREADS", "2") != "1":
    assert PLACEMENT.cores and PLACEMENT.cores < allowed, PLACEMENT.cores
print("ok", sorted(allowed), sorted(PLACEMENT.cores or []))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok")

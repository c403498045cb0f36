"""The C++ runner (runtime/cpp) and the bundle: bit-equal to the Python runtime on x86, clear
errors, runs without Python or environment variables, and ARM output run under qemu."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_near_torch, claiming_a_flag_no_cpu_has, inverted_residual_block

import aotc
from aotc import cpp_runner
from aotc.package import package
from aotc.runtime.inputs import npy_file_name, random_inputs

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None,
                                reason="cmake and g++ build the C++ runner (.ci/run installs them)")
needs_arm = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
    reason="ARM checks need g++-aarch64-linux-gnu and qemu-user (.ci/run installs them)")


def run_runner(cmd, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600, check=False)


def save_inputs(feed: dict, folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    flags = []
    for name, value in feed.items():
        path = folder / npy_file_name(name)  # names like gpu_0/data_0
        np.save(path, value)
        flags += ["--input", f"{name}={path}"]
    return flags


def outputs_of(folder: Path, names) -> list[np.ndarray]:
    return [np.load(folder / npy_file_name(name)) for name in names]


@pytest.fixture(scope="module")
def runner():
    return cpp_runner.build()


def test_runner_matches_python_runtime_bit_for_bit(runner, tiny_so, tmp_path):
    model = aotc.load(tiny_so)
    feed = random_inputs(model.signature, seed=3)
    want = model.run(feed)
    done = run_runner([runner, tiny_so, *save_inputs(feed, tmp_path / "in"),
                       "--output-dir", tmp_path / "out", "--runs", "5"])
    assert done.returncode == 0, done.stderr
    assert "latency ms over 5 runs: p50" in done.stdout
    for got, (name, expect) in zip(outputs_of(tmp_path / "out", want), want.items()):
        assert got.dtype == expect.dtype and np.array_equal(got, expect), name


def test_runner_errors_name_the_problem(runner, tiny_so, tmp_path):
    bad = tmp_path / "x.npy"
    np.save(bad, np.zeros((1, 8, 12, 13), np.float32))
    wrong_shape = run_runner([runner, tiny_so, "--input", f"x={bad}"])
    assert wrong_shape.returncode == 1
    assert "input 'x': expected shape x: float32[1,8,12,12], got [1,8,12,13]" in wrong_shape.stderr
    unknown = run_runner([runner, tiny_so, "--input", f"nope={bad}"])
    assert unknown.returncode == 1 and "the model has no input of that name" in unknown.stderr
    corrupt = tmp_path / "corrupt.so"
    data = bytearray(tiny_so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(data)
    tampered = run_runner([runner, corrupt])
    assert tampered.returncode == 1 and "integrity check failed" in tampered.stderr
    assert run_runner([runner, tmp_path / "none.so"]).returncode == 1
    assert run_runner([runner, tiny_so, "--runs", "x"]).returncode == 2


def test_runner_refuses_a_model_this_cpu_cannot_run(runner, tiny_so, tmp_path):
    """Instead of dying with SIGILL at the first instruction this CPU lacks."""
    done = run_runner([runner, claiming_a_flag_no_cpu_has(tiny_so, tmp_path)])
    assert done.returncode == 1
    assert "this CPU lacks avz2. Compile it for this machine" in done.stderr, done.stderr


def _npy_with_header(path: Path, shape: str, data: bytes, descr: str = "<f4") -> Path:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
                     + header.encode() + data)
    return path


@pytest.mark.parametrize("shape, descr, named", [
    ("(2**62, 4)", "<f4", "is not a tuple of sizes"),
    ("(-1, 4)", "<f4", "is not a tuple of sizes"),
    ("(576460752303423488, 64)", "<f4", "more data than the file holds"),  # 2**67 bytes
    ("(1, 8, 12, 12)", "<f4", "more data than the file holds"),  # 16 bytes of 4,608
    ("(1, 8, 12, 12)", "<f3", "unsupported dtype"),
])
def test_runner_refuses_npy_headers_that_lie(shape, descr, named, runner, tiny_so, tmp_path):
    """A crafted header whose size wrapped to 0 was accepted (exit 0, unreadable output)."""
    bad = _npy_with_header(tmp_path / "x.npy", shape, b"\0" * 16, descr)
    done = run_runner([runner, tiny_so, "--input", f"x={bad}", "--output-dir", tmp_path / "out"])
    assert done.returncode == 1 and named in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_runner_loads_a_bare_file_name(runner, tiny_so, tmp_path):
    """dlopen("model.so") searches the library path; the runner means ./model.so."""
    shutil.copy(tiny_so, tmp_path / "model.so")
    done = run_runner([runner, "model.so", "--output-dir", "out"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "out").glob("*.npy")) and not list((tmp_path / "out").glob("*.tmp*"))


def test_bundle_runs_without_python_or_environment(tiny_so, tmp_path):
    bundle = package(tiny_so, tmp_path / "bundle")
    assert bundle.runtime_bytes < 10e6
    moved = tmp_path / "elsewhere"
    shutil.copytree(bundle.folder, moved)  # rpath is relative: the folder can move
    done = run_runner([moved / "bin" / "aotc-run", moved / "model" / tiny_so.name], env={},
                      cwd="/")
    assert done.returncode == 0, done.stderr
    assert "y: float32[1,10]" in done.stdout


def build_against_bundle(source: Path, bundle) -> Path:
    """An application built from ``source`` against the bundle's API and libraries."""
    binary = source.with_suffix("")
    build = run_runner(["g++", "-std=c++17", source, f"-I{bundle.folder / 'include'}",
                        f"-L{bundle.folder / 'lib'}", "-laotc_model", "-Wl,--no-as-needed",
                        "-ltvm_runtime", "-Wl,--as-needed", "-ltvm_ffi", "-lpthread",
                        f"-Wl,-rpath,{bundle.folder / 'lib'}", "-o", binary])
    assert build.returncode == 0, build.stderr[-2000:]
    return binary


def test_application_builds_against_the_bundle_api(tiny_so, tmp_path):
    bundle = package(tiny_so, tmp_path / "bundle")
    app = tmp_path / "app.cc"
    app.write_text("""
#include <aotc/model.h>
#include <cstdio>
int main(int, char** argv) {
  aotc::Model model(argv[1]);
  auto x = aotc::Empty({1, 8, 12, 12}, DLDataType{kDLFloat, 32, 1});
  for (int i = 0; i < 8 * 12 * 12; ++i) static_cast<float*>(x.data_ptr())[i] = 0.5f;
  auto outputs = model.Run({x});
  aotc::WriteNpy(argv[2], outputs[0]);
  std::printf("%s %zu\\n", model.metadata().inputs[0].ToString().c_str(), outputs.size());
}
""")
    binary = build_against_bundle(app, bundle)
    done = run_runner([binary, bundle.model, tmp_path / "y.npy"])
    assert done.returncode == 0 and "x: float32[1,8,12,12] 1" in done.stdout, done.stderr
    want = aotc.load(tiny_so).run({"x": np.full((1, 8, 12, 12), 0.5, np.float32)})["y"]
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)


FORK_APP = """
#include <aotc/model.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <thread>
// argv[2]: "run-then-fork" or "fork-first": the child runs in its forking thread and in a new
// one; "exit-only": the child of a process that ran the model exits without running it.
int main(int, char** argv) {
  alarm(60);  // a hang ends the process (SIGALRM) instead of the test run
  aotc::Model model(argv[1]);
  auto x = aotc::Empty({1, 8, 12, 12}, DLDataType{kDLFloat, 32, 1});
  for (int i = 0; i < 8 * 12 * 12; ++i) static_cast<float*>(x.data_ptr())[i] = 0.5f;
  auto first = model.Run({x})[0];
  std::vector<float> want(static_cast<float*>(first.data_ptr()),
                          static_cast<float*>(first.data_ptr()) + 10);
  if (std::strcmp(argv[2], "exit-only") == 0) {
    usleep(100000);  // the pool's workers go to sleep
    pid_t pid = fork();
    if (pid == 0) {
      alarm(60);  // alarms are not inherited
      return 0;  // exit() runs the thread-local destructors
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 9;
  }
  if (std::strcmp(argv[2], "fork-first") == 0) {
    aotc::Model fresh(argv[1]);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(60);
      return fresh.Run({x}).size() == 1 ? 0 : 3;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 9;
  }
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    for (int round = 0; round < 3; ++round) {
      auto got = model.Run({x})[0];
      if (std::memcmp(got.data_ptr(), want.data(), 10 * sizeof(float)) != 0) return 4;
    }
    int from_thread = 5;
    std::thread([&] { from_thread = model.Run({x}).size() == 1 ? 0 : 6; }).join();
    return from_thread;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 9;
}
"""


@pytest.mark.parametrize("order", ["run-then-fork", "fork-first", "exit-only"])
def test_cpp_api_works_in_a_forked_child(order, tiny_so, tmp_path):
    """The child of a process that had run a model hung in TVM's pool, on its first run or at
    its exit, once the parent's workers slept (at once with TVM_THREAD_POOL_SPIN_COUNT=0):
    models now run TVM's pools on the runtime's own threads, which a fork does not copy."""
    bundle = package(tiny_so, tmp_path / "bundle")
    app = tmp_path / "fork_app.cc"
    app.write_text(FORK_APP)
    process = subprocess.Popen([build_against_bundle(app, bundle), bundle.model, order],
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "TVM_THREAD_POOL_SPIN_COUNT": "0"})
    try:
        _, stderr = process.communicate(timeout=120)
    finally:  # a child hung before its own alarm must not outlive the test
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 0, (process.returncode, stderr)


def check_arm_under_qemu(onnx_path: Path, tmp_path: Path, rtol=1e-4, atol=1e-4, feed=None,
                         **compile_args) -> dict:
    """Compile for ARM, bundle, run bin/aotc-run under qemu, compare with onnxruntime on x86;
    returns the compile's metadata."""
    import onnxruntime as ort
    so = tmp_path / f"{onnx_path.stem}_arm.so"
    meta = aotc.compile(onnx_path, target="arm", output=so, **compile_args)
    bundle = package(so, tmp_path / f"{onnx_path.stem}_bundle")
    signature = aotc.runtime.signature.ModelSignature.from_json(meta["signature"])
    feed = feed or random_inputs(signature, seed=1)
    done = run_runner([*cpp_runner.launcher("aarch64"), bundle.runner, bundle.model,
                       *save_inputs(feed, tmp_path / "in"), "--output-dir", tmp_path / "out"],
                      env={})
    assert done.returncode == 0, done.stderr
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for name, got, want in zip(names, outputs_of(tmp_path / "out", names),
                               session.run(None, feed)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"output {name}")
    return meta


@needs_arm
def test_arm_model_runs_under_qemu_and_matches_onnxruntime(tiny_onnx, tmp_path):
    check_arm_under_qemu(tiny_onnx, tmp_path)


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "bert"])
def test_arm_examples_under_qemu(name, example_onnx_dir, tmp_path):
    from aotc.examples.export_onnx import export
    check_arm_under_qemu(export(name, example_onnx_dir), tmp_path, rtol=1e-3, atol=1e-3)


@needs_arm
@pytest.mark.slow
def test_arm_light_resnet50_under_qemu(tmp_path):
    from test_models import LIGHT_DIR
    check_arm_under_qemu(LIGHT_DIR / "light_resnet50.onnx", tmp_path, rtol=1e-3, atol=1e-3)


@needs_arm
@pytest.mark.slow
@pytest.mark.parametrize("target", ["arm", "arm-dotprod"])
def test_arm_int8_block_under_qemu_computes_the_x86_int8_codes(target, tmp_path):
    """An int8 inverted-residual block (expand, depthwise, project, residual) compiled for ARM
    and run under qemu: the same outputs as the x86 build (the same int8 codes: dot products in
    int32, requantization rounding half to even on both), near torch's float32."""
    import torch

    from aotc.options import QuantizeOptions

    rng = np.random.default_rng(0)
    net = inverted_residual_block()
    calib = [rng.standard_normal((1, 16, 28, 28)).astype(np.float32) for _ in range(8)]
    builds = {}
    for name in (target, "x86"):
        builds[name] = tmp_path / f"block_{name}.so"
        aotc.compile(net, target=name, output=builds[name],
                     example_inputs=(torch.from_numpy(calib[0]),),
                     quantize=QuantizeOptions(calib, method="minmax"))
    host = aotc.load(builds["x86"])
    x = {host.signature.inputs[0].name: rng.standard_normal((1, 16, 28, 28)).astype(np.float32)}
    bundle = package(builds[target], tmp_path / "bundle")
    done = run_runner([*cpp_runner.launcher("aarch64"), bundle.runner, bundle.model,
                       *save_inputs(x, tmp_path / "in"), "--output-dir", tmp_path / "out"],
                      env={})
    assert done.returncode == 0, done.stderr
    (got,) = outputs_of(tmp_path / "out", [host.signature.outputs[0].name])
    want = assert_near_torch(net, builds["x86"], next(iter(x.values())), 0.01)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.xdist_group("compiled_examples")
@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "bert"])
def test_runner_matches_python_on_examples(name, runner, compiled_example, tmp_path):
    _, so = compiled_example(name)
    model = aotc.load(so)
    feed = random_inputs(model.signature, seed=2)
    want = model.run(feed)
    done = run_runner([runner, so, *save_inputs(feed, tmp_path / "in"), "--output-dir",
                       tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    for got, (out, expect) in zip(outputs_of(tmp_path / "out", want), want.items()):
        assert np.array_equal(got, expect), out


def test_bundle_with_the_farm_server_runs_it_without_environment(tiny_so, tmp_path):
    bundle = package(tiny_so, tmp_path / "bundle", farm_server=True)
    server = bundle.folder / "bin" / "aotc-rpc-server"
    assert (bundle.folder / "lib" / "libtvm_runtime_extra.so").is_file()
    done = run_runner([server], env={}, cwd="/")  # loads its libraries, then refuses the args
    assert done.returncode == 1 and "usage: aotc-rpc-server --tracker" in done.stderr
    assert not (package(tiny_so, tmp_path / "plain").folder / "bin" / "aotc-rpc-server").exists()


def test_runner_writes_1d_and_0d_outputs_numpy_reads(runner, tmp_path):
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]),
         helper.make_node("ReduceSum", ["x"], ["z"], keepdims=0)],
        "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [])])
    path = tmp_path / "shapes.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    so = tmp_path / "shapes.so"
    aotc.compile(path, output=so)
    x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    done = run_runner([runner, so, *save_inputs({"x": x}, tmp_path / "in"),
                       "--output-dir", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    y, z = outputs_of(tmp_path / "out", ["y", "z"])
    assert y.shape == (4,) and np.array_equal(y, np.maximum(x, 0))
    assert z.shape == () and z == np.float32(2.0)


def test_runner_checks_dim_ranges_and_runs_a_bucketed_library(runner, tmp_path):
    """A library with buckets runs in the runner through its symbolic entry (no dispatch
    there yet); a dim outside the model's range is refused by name, as in Python."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "sum.onnx")
    options = aotc.CompileOptions(dim_ranges={"seq": (1, 8)}, buckets={"seq": (4, 8)})
    aotc.compile(tmp_path / "sum.onnx", output=tmp_path / "sum.so", options=options)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    assert np.allclose(aotc.load(tmp_path / "sum.so").run({"x": x})["y"], x.sum(axis=1),
                       atol=1e-5)
    done = run_runner([runner, tmp_path / "sum.so", *save_inputs({"x": x}, tmp_path / "in"),
                       "--output-dir", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    assert np.allclose(outputs_of(tmp_path / "out", ["y"])[0], x.sum(axis=1), atol=1e-5)
    long = np.zeros((1, 9, 4), np.float32)
    refused = run_runner([runner, tmp_path / "sum.so", *save_inputs({"x": long}, tmp_path / "l")])
    assert refused.returncode == 1
    assert "dim 'seq' is 9; this model takes 1 to 8" in refused.stderr, refused.stderr

"""Encrypted models (runtime/encrypted.py): written by ``aotc compile --encrypt-key-file``,
run by the runtime and by ``aotc serve`` from memory only; a wrong key or a changed byte is
refused before anything is loaded."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import aotc
from aotc import cpp_runner
from aotc.cli import main
from aotc.errors import ArtifactError
from aotc.package import package
from aotc.runtime.encrypted import MAGIC

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def sealed(tiny_onnx, tmp_path_factory):
    folder = tmp_path_factory.mktemp("encrypted")
    key = folder / "model.key"
    assert CliRunner().invoke(main, ["keygen", str(key)]).exit_code == 0
    result = CliRunner().invoke(main, ["compile", str(tiny_onnx), "-o", str(folder / "m.so"),
                                       "--encrypt-key-file", str(key)])
    assert result.exit_code == 0, result.output
    return folder / "m.so", key


def test_the_encrypted_library_runs_and_matches_onnxruntime(sealed, tiny_onnx):
    so, key = sealed
    data = so.read_bytes()
    assert data.startswith(MAGIC) and b"\x7fELF" not in data[:64] and b"AOTC_META" not in data
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    model = aotc.load(so, key_file=key)  # in a fresh process (tests/fresh_runner.py)
    x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(str(tiny_onnx)).run(None, {"x": x})[0]
    np.testing.assert_allclose(model(x=x)["y"], want, rtol=1e-4, atol=1e-4)


def test_a_wrong_key_a_changed_byte_or_no_key_is_refused(sealed, tmp_path):
    so, key = sealed
    other = tmp_path / "other.key"
    CliRunner().invoke(main, ["keygen", str(other)])
    with pytest.raises(ArtifactError, match="cannot decrypt: wrong key, or the file was changed"):
        aotc.load(so, key_file=other)
    flipped = bytearray(so.read_bytes())
    flipped[len(flipped) // 2] ^= 1
    (tmp_path / "flipped.so").write_bytes(bytes(flipped))
    with pytest.raises(ArtifactError, match="cannot decrypt: wrong key, or the file was changed"):
        aotc.load(tmp_path / "flipped.so", key_file=key)
    with pytest.raises(ArtifactError, match="the model is encrypted: give its key"):
        aotc.load(so)
    (tmp_path / "short.key").write_text("abcd\n")
    with pytest.raises(ArtifactError, match="not a 256-bit key"):
        aotc.load(so, key_file=tmp_path / "short.key")
    assert CliRunner().invoke(main, ["keygen", str(key)]).exit_code == 1  # never overwritten


def test_the_plaintext_is_only_in_memory(sealed, tmp_path):
    """The process that loads it maps the library from an anonymous memory file, and no file
    in its temp folder or beside the model holds the plaintext."""
    so, key = sealed
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    script = f"""
import os, sys, tempfile
import aotc
model = aotc.load({str(so)!r}, key_file={str(key)!r})
maps = open("/proc/self/maps").read().splitlines()
paths = [line.split(None, 5)[-1] for line in maps if len(line.split(None, 5)) == 6]
libs = {{p for p in paths if p.startswith("/memfd:aotc:") or p == {str(so)!r}}}
print(sorted(libs))
for root, _, files in [*os.walk(tempfile.gettempdir()), *os.walk({str(so.parent)!r})]:
    for name in files:
        try:
            with open(os.path.join(root, name), "rb") as f:
                if b"AOTC_META_V1" in f.read():
                    print("PLAINTEXT", os.path.join(root, name))
        except OSError:
            pass
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin", "TMPDIR": str(private_tmp)},
                          cwd=so.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    mapped = eval(done.stdout.splitlines()[0])  # a printed list of strings
    assert mapped and all(m.startswith("/memfd:aotc:") for m in mapped), mapped
    assert "PLAINTEXT" not in done.stdout, done.stdout


def test_aotc_serve_runs_an_encrypted_model(sealed, tiny_onnx):
    from test_serve import Running, httpclient
    so, key = sealed
    running = Running([str(so), "--key-file", str(key), "--no-grpc"])
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http}")
        x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        want = ort.InferenceSession(str(tiny_onnx)).run(None, {"x": x})[0]
        np.testing.assert_allclose(client.infer("m", [tensor]).as_numpy("y"), want,
                                   rtol=1e-4, atol=1e-4)
    finally:
        assert running.stop() == 0


needs_cpp = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None,
                               reason="cmake and g++ build the C++ runner (.ci/run installs them)")


def _run(cmd, env: dict, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", **env}, cwd=cwd, check=False)


@needs_cpp
def test_the_cpp_runner_decrypts_into_memory_with_the_key_from_each_source(sealed, tmp_path):
    """aotc-run takes the key from --key-file, AOTC_MODEL_KEY or AOTC_MODEL_KEY_FILE; outputs
    are bit-equal to the Python runtime's; nothing is left in its temp folder."""
    so, key = sealed
    runner = cpp_runner.build()
    x = np.random.default_rng(2).standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = aotc.load(so, key_file=key)(x=x)["y"]
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    sources = {"flag": (["--key-file", key], {}),
               "hex": ([], {"AOTC_MODEL_KEY": key.read_text().strip()}),
               "file": ([], {"AOTC_MODEL_KEY_FILE": str(key)})}
    for name, (flags, env) in sources.items():
        out = tmp_path / name
        done = _run([runner, so, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", out,
                     *flags], {"TMPDIR": str(private_tmp), **env})
        assert done.returncode == 0, (name, done.stderr)
        assert np.array_equal(np.load(out / "y.npy"), want), name
    assert not list(private_tmp.iterdir())


@needs_cpp
def test_the_cpp_runner_refuses_a_wrong_key_a_changed_byte_or_no_key(sealed, tmp_path):
    so, key = sealed
    runner = cpp_runner.build()
    other = tmp_path / "other.key"
    CliRunner().invoke(main, ["keygen", str(other)])
    flipped = bytearray(so.read_bytes())
    flipped[len(flipped) // 3] ^= 1
    (tmp_path / "flipped.so").write_bytes(bytes(flipped))
    (tmp_path / "short.key").write_text("abcd\n")
    cases = [([so, "--key-file", other], {}, "cannot decrypt: wrong key, or the file was changed"),
             ([tmp_path / "flipped.so", "--key-file", key], {},
              "cannot decrypt: wrong key, or the file was changed"),
             ([so], {}, "the model is encrypted: give its key"),
             ([so, "--key-file", tmp_path / "short.key"], {}, "not a 256-bit key"),
             ([so], {"AOTC_MODEL_KEY": "00" * 31}, "AOTC_MODEL_KEY: not a 256-bit key"),
             ([so, "--key-file", tmp_path / "none.key"], {}, "cannot read the key file")]
    for args, env, message in cases:
        done = _run([runner, *args], env)
        assert done.returncode == 1 and message in done.stderr, (args, env, done.stderr)
        assert done.stderr.startswith("aotc-run: "), done.stderr


@needs_cpp
def test_a_cpp_application_maps_the_encrypted_bundle_model_only_from_memory(sealed, tmp_path):
    """The bundle ships the model encrypted and no key; an application built against it loads
    the model with its key, and every file it maps that holds aotc metadata is a memory file."""
    from test_cpp_runtime import build_against_bundle
    so, key = sealed
    bundle = package(so, tmp_path / "bundle", key_file=key)
    assert bundle.model.read_bytes() == so.read_bytes()
    assert "The model is encrypted" in (bundle.folder / "README.md").read_text()
    assert not [p for p in bundle.folder.rglob("*") if p.is_file() and
                key.read_bytes().strip() in p.read_bytes()]
    app = tmp_path / "app.cc"
    app.write_text("""
#include <aotc/model.h>
#include <cstdio>
#include <fstream>
#include <string>
int main(int, char** argv) {
  aotc::Model model(argv[1], true, argv[2]);
  auto x = aotc::Empty({1, 8, 12, 12}, DLDataType{kDLFloat, 32, 1});
  for (int i = 0; i < 8 * 12 * 12; ++i) static_cast<float*>(x.data_ptr())[i] = 0.25f;
  aotc::WriteNpy(argv[3], model.Run({x})[0]);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    size_t slash = line.find('/');
    if (slash != std::string::npos) std::printf("%s\\n", line.substr(slash).c_str());
  }
}
""")
    binary = build_against_bundle(app, bundle)
    done = _run([binary, bundle.model, key, tmp_path / "y.npy"], {"TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    model = aotc.load(so, key_file=key)
    want = model.run({"x": np.full((1, 8, 12, 12), 0.25, np.float32)})["y"]
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)
    plaintext_marker = f"AOTC_META_V1:{model.metadata['hash']}".encode()
    mapped = set(done.stdout.splitlines())
    assert any(p.startswith("/memfd:aotc:m.so") for p in mapped), mapped
    for path in mapped:
        try:
            data = Path(path).read_bytes()
        except OSError:
            continue
        assert plaintext_marker not in data, path

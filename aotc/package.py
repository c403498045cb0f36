"""``aotc package``: a folder that runs a compiled model on a machine without Python.

    bundle/
      bin/aotc-run            the C++ runner, rpath $ORIGIN/../lib (no environment variables)
      bin/aotc-rpc-server     with farm_server: makes the machine a device of a tuning farm
      lib/libtvm_runtime.so   TVM's runtime for the model's architecture (the Relax VM)
      lib/libtvm_ffi.so
      lib/libtvm_runtime_extra.so   with farm_server: what aotc-rpc-server needs beyond it
      lib/libtvm_runtime_cuda.so, libcudart.so.13   for CUDA models (the GPU driver comes
                              from the machine)
      lib/libaotc_model.a     the C++ API (include/aotc/model.h) for applications
      include/                aotc/model.h and tvm-ffi's headers it includes
      model/<name>.so         the model, unchanged (its hash is checked at load)
      README.md
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from aotc import cpp_runner, runtime_libs
from aotc.errors import AotcError
from aotc.runtime import encrypted

BUNDLE_RPATH = "$ORIGIN/../lib"


@dataclass(frozen=True)
class Bundle:
    folder: Path
    runner: Path
    model: Path
    arch: str
    runtime_bytes: int   # everything but the model
    model_bytes: int


def package(model: str | Path, output: str | Path, farm_server: bool = False,
            key_file: str | Path | None = None) -> Bundle:
    """Write the bundle; with ``farm_server``, also the RPC server that makes the target
    machine a tuning-farm device (1.4 MB more). An encrypted model is copied encrypted; its
    key (``key_file``, or the AOTC_MODEL_KEY variables) is needed here only to read its
    metadata, and is not put in the bundle."""
    model, out = Path(model), Path(output)
    # refuses a corrupt or foreign file before any work
    meta = encrypted.read_metadata(model, key_file)
    arch = meta["target"].get("arch", "x86_64")
    if out.exists() and any(out.iterdir()):
        raise AotcError(f"{out}: exists and is not empty; give a new folder")
    libs = runtime_libs.for_arch(arch)
    runner = cpp_runner.build(arch, rpath=BUNDLE_RPATH)
    for sub in ("bin", "lib", "include", "model"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(runner, out / "bin" / "aotc-run")
    extras = [libs.tvm_runtime_extra] if farm_server else []
    if farm_server:
        shutil.copy2(runner.parent / "aotc-rpc-server", out / "bin" / "aotc-rpc-server")
    shutil.copy2(runner.parent / "libaotc_model.a", out / "lib")
    device = meta["target"].get("device", "cpu")
    for lib in (libs.tvm_runtime, libs.tvm_ffi, *extras, *runtime_libs.device_libraries(device)):
        shutil.copy2(lib, out / "lib" / lib.name)
    shutil.copytree(libs.include / "tvm", out / "include" / "tvm")
    shutil.copytree(libs.include / "dlpack", out / "include" / "dlpack")
    shutil.copytree(cpp_runner.SOURCE / "include" / "aotc", out / "include" / "aotc")
    shutil.copy2(model, out / "model" / model.name)
    (out / "README.md").write_text(_readme(model.name, meta, arch, farm_server,
                                           encrypted.is_encrypted(model)))
    model_bytes = model.stat().st_size
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return Bundle(out, out / "bin" / "aotc-run", out / "model" / model.name, arch,
                  total - model_bytes, model_bytes)


def _readme(name: str, meta: dict, arch: str, farm_server: bool, sealed: bool) -> str:
    inputs = "\n".join(f"- `{t['name']}`: {t['dtype']}{t['shape']}"
                       for t in meta["signature"]["inputs"])
    first = meta["signature"]["inputs"][0]["name"] if meta["signature"]["inputs"] else "x"
    return f"""# {name} (aotc bundle, {arch}, target {meta['target']['name']})

Runs without Python: copy this folder to a {arch} Linux machine (glibc 2.28 or newer).

    bin/aotc-run model/{name} --input {first}=input.npy --output-dir out --runs 100

prints each output and latency percentiles; `--output-dir` writes `<output name>.npy`. Inputs
not given are random. The model's hash is checked before it is loaded.
""" + (_ENCRYPTED_README if sealed else "") + f"""
Inputs:
{inputs}

## From C++

    #include <aotc/model.h>
    aotc::Model model("model/{name}");
    auto outputs = model.Run({{aotc::ReadNpy("input.npy")}});

    g++ -std=c++17 app.cc -Iinclude -Llib -laotc_model -Wl,--no-as-needed -ltvm_runtime \\
        -Wl,--as-needed -ltvm_ffi -lpthread -Wl,-rpath,'$ORIGIN/lib'

(`libtvm_runtime` must stay linked: it registers the virtual machine the model runs on.)
""" + (_FARM_README if farm_server else "")


_ENCRYPTED_README = """
The model is encrypted (AES-256-GCM): give its key with `--key-file KEY`, `AOTC_MODEL_KEY`
(64 hex digits) or `AOTC_MODEL_KEY_FILE`. It is decrypted into memory, never to disk; this
needs OpenSSL's libcrypto (libcrypto.so.3 or .so.1.1) on the machine.
"""

_FARM_README = """
## As a device of a tuning farm

    bin/aotc-rpc-server --tracker HOST:PORT --key KEY --host THIS_MACHINES_ADDRESS

registers this machine with an aotc/TVM RPC tracker (see aotc farm). It runs whatever code it
is sent: keep it on a private network.
"""

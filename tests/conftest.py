import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def example_onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("example_onnx")


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory):
    """A small conv+relu+pool+gemm ONNX model, fast to compile, for CLI and runtime tests."""
    from onnx_builders import tiny_cnn
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    import onnx
    onnx.save(tiny_cnn(), path)
    return path


@pytest.fixture(scope="session")
def tiny_so(tiny_onnx, tmp_path_factory):
    import aotc
    out = tmp_path_factory.mktemp("tiny_so") / "tiny.so"
    aotc.compile(tiny_onnx, target="x86", output=out)
    return out

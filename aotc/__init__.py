"""aotc: an ahead-of-time compiler for neural networks on Apache TVM.

    import aotc
    aotc.compile("model.onnx", target="x86", output="model.so")
    model = aotc.load("model.so")
    outputs = model(input=x)
"""

from .api import compile, load, tune
from .options import CompileOptions, QuantizeOptions, TuneOptions

__version__ = "0.1.0"
__all__ = ["CompileOptions", "QuantizeOptions", "TuneOptions", "compile", "load", "tune",
           "__version__"]

"""``parsed(source)``: a PrimFunc from TVMScript text, parsed once per process.

``top_level.prim_func``: TVMScript's ``T.prim_func`` for functions defined at a module's top
level, without the cost of ``inspect.stack()``: ``@top_level.prim_func(s_tir=True)`` (the
parser reads the options from the decorator's text, and only from an ``X.prim_func(...)``).

The parser takes ``inspect.stack()`` when the decorator is made, to find closure variables in
enclosing frames and to tell a class body from a module. That reads the source lines of every
frame on the stack; during an import the stack is deep, and it made parsing four intrinsics
take a second. A module-level function has no enclosing frames to search, so the frames are
listed here without their source lines (``code_context`` None, which the parser reads as "not
in a class")."""

from __future__ import annotations

import functools
import inspect
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import tvm
from tvm.script import tirx as T


@functools.lru_cache(maxsize=1024)
def parsed(source: str):
    """The PrimFunc ``source`` (TVMScript using ``T``) defines. The passes that write kernels
    as text write the same few again and again (one per rank and dtype); a parse costs tens of
    milliseconds, and a PrimFunc is an immutable value that any number of modules may hold."""
    return tvm.script.from_source(source, extra_vars={"T": T})


def _prim_func(**options):
    """``T.prim_func(**options)`` for a function defined at a module's top level."""
    with _frames_without_source():
        return T.prim_func(**options)


top_level = SimpleNamespace(prim_func=_prim_func)
_prim_func.dispatch_token = "tirx"


@contextmanager
def _frames_without_source():
    original = inspect.stack

    def stack(context: int = 1):
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno,
                                            frame.f_code.co_name, None, None))
            frame = frame.f_back
        return frames
    inspect.stack = stack
    try:
        yield
    finally:
        inspect.stack = original

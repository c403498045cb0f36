"""Errors aotc raises on purpose. Each message names the problem (file, op, input, expected vs.
got); the CLI prints it on one line and exits 1 (2 for usage errors)."""


class AotcError(Exception):
    """Base class: an error whose message is meant for the user as it is."""


class ModelLoadError(AotcError):
    """The model file cannot be read, or refers to files outside its folder."""


class UnsupportedModelError(AotcError):
    """The model uses ops, domains or opsets that the importer does not handle."""


class InputMismatchError(AotcError):
    """Inputs given to a compiled model do not match its signature."""


class ArtifactError(AotcError):
    """A compiled .so is not an aotc artifact, or failed its integrity check."""


class TargetError(AotcError):
    """Unknown target name, or a target this machine cannot build for."""


class CompileError(AotcError):
    """TVM failed while compiling; the message says at which phase."""


def last_line(err: BaseException) -> str:
    """The last line of an exception's message ('' if none): TVM errors carry long C++ traces
    whose final line is the one that says what went wrong."""
    text = str(err).strip()
    return text.splitlines()[-1] if text else ""

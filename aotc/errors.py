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


class ModelRunError(AotcError):
    """A compiled model stopped with an error while running (e.g. an index out of range)."""


class ArtifactError(AotcError):
    """A compiled .so is not an aotc artifact, or failed its integrity check."""


class TargetError(AotcError):
    """Unknown target name, or a target this machine cannot build for."""


class CompileError(AotcError):
    """TVM failed while compiling; the message says at which phase."""


class FarmError(AotcError):
    """The farm cannot serve: tracker down or frozen, or no server of the key."""


class TrackerUnreachable(FarmError):
    """The tracker does not answer (down, frozen, or not a tracker)."""


# Lines of a TVM error that never say what went wrong: TVMScript's trailer, the caret and gutter
# lines of a DiagnosticError, and the backtrace hint.
_NOISE_PREFIXES = ("# Metadata omitted", "note: run with", "-->", "|", "^", "File ",
                   "Traceback (most recent")


def meaningful_line(err: BaseException) -> str:
    """The line of an exception's message that says what went wrong ('' if none).

    TVM errors carry C++ backtraces, TVMScript dumps ending in "# Metadata omitted...", and
    DiagnosticErrors whose last lines are source excerpts. Preference: an "error:" line (with
    the "Traceback:" detail that follows it, if any), else the last line that is not noise."""
    lines = [line.strip() for line in str(err).splitlines()]
    lines = [line for line in lines if line and not line.startswith(_NOISE_PREFIXES)]
    for i, line in enumerate(lines):
        if line.startswith("error:"):
            detail = [rest for rest in lines[i + 1:] if rest.startswith("Traceback:")]
            return line[len("error:"):].strip() + (f" ({detail[0]})" if detail else "")
    for i, line in enumerate(lines):
        # "CodeGenVM cannot emit ... Offending call:\nR.where(...)": the sentence, then the call
        if line.startswith("Offending call:") and i > 0:
            return f"{lines[i - 1]} ({' '.join(lines[i + 1:i + 2])})"
    return lines[-1] if lines else ""

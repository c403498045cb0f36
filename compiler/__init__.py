"""aotc's compiler: frontends -> passes -> schedules -> one .so. See shared DESIGN.md."""

from .build import build
from .frontends import ImportedModel, import_model

__all__ = ["ImportedModel", "build", "import_model"]

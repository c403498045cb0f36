"""mkdocs hook: the repository's CHANGELOG.md is served as the site's changelog page, so that
the history has one file (at the root, where people look for it) and no copy in docs/."""

from pathlib import Path

from mkdocs.structure.files import File

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"


def on_files(files, config):
    text = CHANGELOG.read_text().replace("](docs/", "](")
    files.append(File.generated(config, "changelog.md", content=text))
    return files

"""ARCHITECTURE.md's package map names every module of plelab/, each under its own folder."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def map_names() -> dict[str, set[str]]:
    """Folder ('' for plelab/ itself) -> every ``name.py`` the map's block for that folder mentions."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("## Package map", 1)[1].split("```", 2)[1]
    names: dict[str, set[str]] = {"": set()}
    folder = ""
    for line in block.splitlines():
        top = re.match(r"^  (\S+\.py)\b", line)
        sub = re.match(r"^  (\w+)/", line)
        if top:
            folder = ""
        elif sub:
            folder = sub.group(1)
            names.setdefault(folder, set())
        names[folder] |= set(re.findall(r"\b(\w+\.py)\b", line))
    return names


def test_every_module_is_in_the_map_under_its_folder():
    names = map_names()
    missing = []
    for path in sorted((ROOT / "plelab").rglob("*.py")):
        rel = path.relative_to(ROOT / "plelab")
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        if path.name == "__init__.py" and folder:
            continue  # a package's __init__ is the folder's own line
        if path.name not in names.get(folder, set()):
            missing.append(str(rel))
    assert not missing, f"ARCHITECTURE.md's package map does not name: {', '.join(missing)}"

"""The layering rule, read from the source: a package imports only packages at or below its own layer.

Every import counts — at module level, inside functions, and ``importlib.import_module`` / ``__import__``
calls with a literal name. Function-level imports of plelab's own modules are not allowed at all (they hid
upward imports before); function-level imports of other packages are allowed only for optional or heavy
dependencies and carry a one-line reason (a comment on the line or the line above).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "plelab"

# Lowest first. Shared infrastructure sits below every concept package.
LAYERS: list[set[str]] = [
    {"errors", "io", "locks", "faults", "runtime", "precision", "provenance", "distributed"},
    {"config"},
    {"model"},
    {"data"},
    {"training"},
    {"diagnostics"},
    {"integrations"},
    {"runs"},
    {"sweeps"},
    {"stats"},
    {"scaling"},
    {"calibration"},
    {"reports"},
    {"visual"},
    {"demo"},
    {"cli", "__init__", "__main__"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def unit_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """``(line, target module, inside a function)`` for every import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path).split(".")
    is_package = path.name == "__init__.py"

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child.lineno, alias.name, in_function
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here if is_package else here[:-1]
                    base = base[:len(base) - (child.level - 1)]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                for alias in child.names:
                    yield child.lineno, f"{module}.{alias.name}" if module == "plelab" else module, in_function
            elif isinstance(child, ast.Call):
                fn = child.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if name in ("import_module", "__import__") and child.args and isinstance(child.args[0], ast.Constant):
                    yield child.lineno, str(child.args[0].value), in_function
            yield from visit(child, nested)

    yield from visit(tree, False)


def _target_unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "plelab":
        return None
    if len(parts) == 1 or parts[1] == "__version__":
        return "errors"  # the root package's version string: no dependency
    return parts[1]


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    assert {unit_of(p) for p in _sources()} <= set(RANK), {unit_of(p) for p in _sources()} - set(RANK)


def test_no_package_imports_one_above_it():
    bad = []
    for path in _sources():
        src = unit_of(path)
        for line, module, _ in _imports(path):
            dst = _target_unit(module)
            if dst is not None and dst in RANK and RANK[dst] > RANK[src]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {src} imports {module} ({dst} is above it)")
    assert not bad, "\n".join(bad)


def test_function_level_imports_are_for_optional_dependencies_only_and_say_why():
    bad = []
    for path in _sources():
        lines = path.read_text().splitlines()
        for line, module, in_function in _imports(path):
            if not in_function:
                continue
            if module.startswith("plelab"):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: function-level import of {module}")
                continue
            said = "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")
            if not said:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: function-level import of {module} without "
                           "a one-line reason")
    assert not bad, "\n".join(bad)

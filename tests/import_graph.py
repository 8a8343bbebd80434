"""The import graph of one of the project's packages, read from its source
(every import statement, including those inside functions and under
``TYPE_CHECKING``: a cycle hidden there is still a cycle for the reader), for
the layer tests of the operator (tests/unit/operator/test_import_contract.py)
and of the trainer (tests/unit/trainer/test_layers.py)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# A package's layers, lowest first: (name, the top-level modules or subpackages
# in it; "" is the package's own __init__).
Layers = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class ImportGraph:
    package: str
    modules: dict[str, Path]  # dotted name -> file
    edges: dict[str, set[str]]  # module -> the package's modules it imports

    @classmethod
    def of(cls, root: Path) -> ImportGraph:
        modules = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
        edges = {
            name: {m for m in imports(root, path, modules) if m in modules and m != name}
            for name, path in modules.items()
        }
        return cls(root.name, modules, edges)

    def upward_imports(self, module: str, layers: Layers) -> list[str]:
        """Each import of ``module`` that goes up ``layers``, said in words."""
        rank, layer = layer_of(module, layers)
        return [
            f"{module} (layer {layer}) imports {imported} (layer {above})"
            for imported in sorted(self.edges[module])
            for imported_rank, above in [layer_of(imported, layers)]
            if imported_rank > rank
        ]

    def cycle_through(self, start: str) -> list[str] | None:
        """A path start -> ... -> start over the graph, or None."""
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            module, path = stack.pop()
            for imported in sorted(self.edges[module]):
                if imported == start:
                    return [*path, start]
                if imported not in seen:
                    seen.add(imported)
                    stack.append((imported, [*path, imported]))
        return None


def top_level(module: str) -> str:
    """The package's top-level module or subpackage ``module`` lives in."""
    return module.split(".")[1] if "." in module else ""


def layer_of(module: str, layers: Layers) -> tuple[int, str]:
    """The rank and name of the layer ``module`` belongs to."""
    for rank, (name, members) in enumerate(layers):
        if top_level(module) in members:
            return rank, name
    raise AssertionError(f"{module} is in no layer: add {top_level(module)!r} to one of LAYERS")


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module an import statement of ``path`` names: ``from a import b``
    names ``a.b`` when that is a module of the package, else ``a``."""
    own = _module_name(root, path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                module = f"{base}.{alias.name}"
                found.add(module if module in modules else base)
    return found

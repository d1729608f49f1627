"""The package tree is the architecture: imports only go down the layers, and the layers below
the stream shell never import faust or aiokafka.  Read from the source with ``ast``, so a lazy
import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "streamdedup"

#: Bottom up.  A module may import from its own layer and the layers before it, never after.
LAYERS = [
    {"errors"},
    {"fingerprinting"},
    {"index"},
    {"engine"},
    {"pipeline", "settings"},
    {"stream", "crawler", "client", "scrapy_pipeline"},
    {"cli", "__main__"},
]
KAFKA_FREE = {"errors", "fingerprinting", "index", "engine", "pipeline", "settings"}


def _layer(room: str) -> int:
    for i, rooms in enumerate(LAYERS):
        if room in rooms:
            return i
    raise AssertionError(f"streamdedup/{room} is in no layer of tests/test_layers.py: put it in one")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts == ("__init__.py",):
            continue  # the public API re-exports from every layer
        yield rel, ast.parse(path.read_text(), str(path))


def _imports(tree: ast.AST, rel: Path):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = ["streamdedup", *rel.parts[:-1]][: len(rel.parts) - node.level + 1]
                yield ".".join([*base, node.module] if node.module else base)
            else:
                yield node.module or ""


def _room(rel: Path) -> str:
    return rel.parts[0].removesuffix(".py")


@pytest.mark.parametrize("rel,tree", list(_modules()), ids=lambda v: str(v) if isinstance(v, Path) else "")
def test_imports_only_go_down(rel, tree):
    here = _layer(_room(rel))
    for name in _imports(tree, rel):
        parts = name.split(".")
        if parts[0] in {"faust", "aiokafka", "mode"}:
            assert _room(rel) not in KAFKA_FREE, f"{rel} imports {name}: the layers below stream/ stay Kafka-free"
        if parts[0] != "streamdedup" or len(parts) < 2:
            continue
        there = _layer(parts[1])
        assert there <= here, f"{rel} (layer {here}) imports {name} (layer {there}): imports go down the layers"


def test_every_room_has_a_layer():
    rooms = {
        p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name != "__pycache__" and p.name != "__init__.py"
    }
    for room in rooms:
        _layer(room)


def test_a_violation_is_caught(tmp_path):
    """The check itself can fail: an engine module importing the stream shell is reported."""
    tree = ast.parse("from streamdedup.stream.app import Worker\n")
    with pytest.raises(AssertionError, match="imports go down the layers"):
        test_imports_only_go_down(Path("engine/scan.py"), tree)

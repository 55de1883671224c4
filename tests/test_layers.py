"""The Python package's layers, as the build enforces the C++ ones: a module imports only
its own layer and those below it (runtime at the bottom; training and control on it;
the strategies on training; launch on control; the engines, ray and spark, on launch)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# tf_bps.<layer> -> the layers its modules may import ("tf_bps": the package's own names).
ALLOWED = {
    "runtime": {"runtime"},
    "training": {"runtime", "training"},
    "control": {"runtime", "control"},
    "strategies": {"runtime", "training", "strategies", "tf_bps"},
    "launch": {"runtime", "control", "launch", "tf_bps"},
    # The engines start jobs with their own means, on the launcher's pieces.
    "ray": {"runtime", "control", "launch", "ray", "tf_bps"},
    "spark": {"runtime", "control", "launch", "spark", "tf_bps"},
}


def _imported_layers(path: Path) -> set[str]:
    layers = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tf_bps":
                layers.add(parts[1] if len(parts) > 1 else "tf_bps")
    return layers


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_nothing_above_it(layer):
    folder = ROOT / ("strategies" if layer == "strategies" else f"tf_bps/{layer}")
    wrong = {str(path.relative_to(ROOT)): sorted(_imported_layers(path) - ALLOWED[layer])
             for path in sorted(folder.rglob("*.py"))}
    assert not {path: layers for path, layers in wrong.items() if layers}

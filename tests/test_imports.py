"""The package's import graph: arrows run one way (no cycle between modules), and torch
never reaches the coordinator or the operations package (DESIGN.md's layout)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each installed package and the folder it comes from (pyproject.toml's package-dir).
PACKAGES = {
    "specdec": "specdec",
    "specdec.v1": "protos/specdec/v1",
    "specdec.kernels": "kernels",
    "specdec.runtime": "runtime",
    "specdec.model_service": "model_service",
    "specdec.draft_service": "draft_service",
    "specdec.target_service": "target_service",
    "specdec.coordinator": "coordinator",
    "specdec.auth": "auth",
    "specdec.telemetry": "telemetry",
}
# The operations package is `specdec` itself (its own modules: cli, launcher, bench, ...).
TORCH_FREE = ("specdec.coordinator", "specdec")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by its installed name."""
    found = {}
    for package, folder in PACKAGES.items():
        base = root / folder
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            if package == "specdec" and len(parts) > 1:
                continue  # the namespace root holds the operations modules only
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports at module level (not under TYPE_CHECKING or
    inside functions), resolved to modules (``from a import b`` is ``a.b`` when that is a
    module, else ``a``)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as the modules along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports_of(path, name, set(found)) for name, path in found.items()}


def test_no_module_imports_itself_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_planted_cycle_is_found(tmp_path):
    for folder in PACKAGES.values():
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "specdec" / "gateway.py").write_text("from specdec.launcher import Stack\n")
    (tmp_path / "specdec" / "launcher.py").write_text("from specdec.gateway import start\n")
    assert find_cycle(import_graph(tmp_path)) == [
        "specdec.gateway",
        "specdec.launcher",
        "specdec.gateway",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_never_reaches_the_coordinator_or_the_operations(module):
    code = (
        f"import sys, importlib, pkgutil; m = importlib.import_module({module!r}); "
        "[importlib.import_module(i.name) for i in pkgutil.walk_packages("
        "getattr(m, '__path__', []), m.__name__ + '.') if not i.name.endswith('__main__')]; "
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} imports torch: {out.stdout[:200]}"


@pytest.mark.slow
def test_nothing_installs_under_a_top_level_name_other_packages_use():
    code = (
        "import sys, specdec.cli, specdec.coordinator.api.server, specdec.target_service.servicer, "
        "specdec.draft_service.servicer; "
        "print(sorted({'kernels', 'runtime', 'auth', 'telemetry', 'coordinator', 'protos'} & "
        "set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

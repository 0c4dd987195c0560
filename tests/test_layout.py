"""The folders show the architecture: each top-level package imports only the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "workloads", "tuner", "lab", "control", "console")
# What each package may import from the project (besides itself and the generated protos).
ALLOWED = {
    "engine": set(),
    "workloads": {"engine"},
    "tuner": {"engine"},  # a pure core and a client of the contract (prefill_gate): no control/ inside
    "lab": {"engine", "workloads", "tuner"},
    "control": {"engine", "workloads", "tuner", "lab", "console"},
    "console": {"engine", "workloads", "tuner", "lab", "control"},
}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names & set(PACKAGES)


def test_engine_is_what_a_rank_runs_and_clients_sit_above_it() -> None:
    violations = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for imported in _imported_packages(path) - {package} - ALLOWED[package]:
                violations.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert violations == []


def test_no_folder_outgrows_fifteen_modules() -> None:
    crowded = []
    for package in PACKAGES:
        for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > 15:
                crowded.append(f"{folder.relative_to(ROOT)}: {len(modules)}")
    assert crowded == []

"""Imports flow one way, read from every module's source (ast), function-level and TYPE_CHECKING imports included.

    rollout_server  ->  finetune_deploy  ->  engine, trace_pipeline  ->  kernels

Inside engine, what a module may import says where it runs (docs/architecture.md):
    engine/*.py, engine/kv_tier/   the contract and leaf helpers every process shares: nothing above them
    engine/worker/                 loaded inside vLLM worker processes: the shared layer only
    engine/supervisor/             starts and watches processes: the shared layer, and the worker modules it names
    engine/client/                 the front door's way to the workers: all of the above
And no two modules import each other, directly or around a loop.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from rollout_server.harness.stack import REPO

PACKAGES = ("rollout_server", "finetune_deploy", "engine", "trace_pipeline", "kernels")
MAY_IMPORT = {
    "rollout_server": {"finetune_deploy", "engine", "trace_pipeline", "kernels"},
    "finetune_deploy": {"engine", "trace_pipeline", "kernels"},
    "engine": {"kernels"},
    "trace_pipeline": {"kernels"},
    "kernels": set(),
}
ENGINE_MAY_IMPORT = {
    "shared": {"shared"},
    "worker": {"shared", "worker"},
    "supervisor": {"shared", "worker", "supervisor"},
    "client": {"shared", "worker", "supervisor", "client"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The project module an import names (a package's __init__ for a package), or None outside the project."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@cache
def imports_of(module: str) -> frozenset[str]:
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from engine import stream_interval` imports the module engine.stream_interval
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base for alias in node.names]
        else:
            continue
        found |= {resolved for name in names if (resolved := _resolve(name)) and resolved != module}
    return frozenset(found)


def _engine_layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in ("worker", "supervisor", "client"):
        return parts[1]
    return "shared"


def test_the_project_is_found():
    assert {"engine.contract", "rollout_server.app", "finetune_deploy.executor", "kernels.nvfp4"} <= set(modules())
    assert "engine.stream_interval" in imports_of("engine.worker.dynamo_worker")  # `from engine import ...`


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_one_above_it(package):
    upward = sorted(f"{module} -> {imported}" for module in modules() if module.split(".")[0] == package
                    for imported in imports_of(module)
                    if imported.split(".")[0] not in MAY_IMPORT[package] | {package})
    assert not upward, "imports against the one direction:\n" + "\n".join(upward)


def test_engine_modules_import_only_what_runs_where_they_run():
    wrong = sorted(f"{module} ({_engine_layer(module)}) -> {imported} ({_engine_layer(imported)})"
                   for module in modules() if module.startswith("engine.")
                   for imported in imports_of(module) if imported.startswith("engine.")
                   and _engine_layer(imported) not in ENGINE_MAY_IMPORT[_engine_layer(module)])
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: any with two modules or more is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in imports_of(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(modules()):
        if module not in index:
            visit(module)
    assert not cycles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)

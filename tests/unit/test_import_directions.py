"""The packages' import directions, as each package's __init__ states them.

Every import in the tree counts, function-level ones included: a lazy import is still a
dependency. A package may import itself and what ALLOWED lists; the cross-cutting
modules (errors, settings, sampling, loop_thread, openai_args) are open to all and import
nothing of tailguard's but each other. Third-party rules say what a layer must never pull in
(the engine no Redis or Celery; the API no torch, and of vLLM only its frontend, from one
module; pure policy no I/O client at all).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

CROSS_CUTTING = {"errors", "settings", "sampling", "loop_thread", "openai_args"}

#: package -> the tailguard packages it may import (besides itself and CROSS_CUTTING)
ALLOWED: dict[str, set[str]] = {
    "redis": set(),
    "host": set(),
    "lanes": set(),
    "model": set(),
    "engine": {"host", "model"},
    "jobs": {"redis", "lanes"},
    "observe": {"jobs", "lanes", "engine", "redis"},
    "gateway": {"jobs", "lanes", "model", "observe", "redis"},
    "worker": {"engine", "jobs", "lanes", "model", "observe", "host", "redis"},
    "launch": {"host", "lanes", "model", "redis"},
    "control": {"jobs", "lanes", "redis"},
    # tools: anything of the product, and only the CLI imports them
    "bench": {"redis", "host", "lanes", "model", "engine", "jobs", "observe", "gateway",
              "worker", "launch", "plan", "cli"},
    "plan": {"host", "lanes", "model", "engine"},
    "conformance": {"host", "lanes", "model", "gateway", "bench"},
}
#: third-party top-level modules a package must never import
FORBIDDEN_THIRD_PARTY: dict[str, set[str]] = {
    "lanes": {"redis", "celery", "kombu", "flask", "vllm", "torch", "transformers"},
    "engine": {"redis", "celery", "kombu", "flask"},
    "model": {"redis", "celery", "kombu", "flask", "vllm"},  # the demo builder needs torch
    "gateway": {"celery", "torch"},
    "jobs": {"vllm", "torch", "flask"},
    "host": {"celery", "kombu", "flask", "vllm", "torch", "transformers"},
}
TOOLS = {"bench", "plan", "conformance"}
#: The API's one module that imports vLLM, and the parts of vLLM it may import: its OpenAI
#: frontend (request models, render layer, argument parser, configs), never an engine
API_VLLM_MODULE = "tailguard/gateway/openai_frontend.py"
API_VLLM_PARTS = ("vllm.entrypoints.", "vllm.config", "vllm.engine.arg_utils", "vllm.exceptions",
                  "vllm.envs", "vllm.utils.argparse_utils", "vllm.version")
#: vLLM's engine side: what an API process must never import (it would start or drive one)
VLLM_ENGINE_PARTS = ("vllm.v1.engine", "vllm.v1.worker", "vllm.v1.executor", "vllm.model_executor",
                     "vllm.engine.async_llm_engine", "vllm.engine.llm_engine", "vllm.entrypoints.llm")


def _imports(path: Path) -> set[str]:
    """Every module name an import statement in `path` names (absolute imports only)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            if node.module == "tailguard":  # from tailguard import settings
                out.update(f"tailguard.{a.name}" for a in node.names)
    return out


def _unit(path: Path) -> str:
    """The package (or top-level module) of tailguard a file belongs to."""
    rel = path.relative_to(ROOT / "tailguard").with_suffix("")
    return rel.parts[0]


FILES = sorted((ROOT / "tailguard").rglob("*.py"))


def test_the_top_level_holds_only_cross_cutting_modules():
    top = {p.stem for p in (ROOT / "tailguard").glob("*.py")} - {"__init__"}
    assert top == CROSS_CUTTING | {"cli"}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_every_package_says_what_it_owns_and_may_import(package):
    doc = ast.get_docstring(ast.parse((ROOT / "tailguard" / package / "__init__.py").read_text()))
    assert doc, f"tailguard/{package}/__init__.py has no docstring"
    if package not in TOOLS:
        assert "May import" in doc, f"tailguard/{package}/__init__.py does not say what it may import"


def test_imports_follow_the_allowed_directions():
    wrong = []
    for path in FILES:
        unit = _unit(path)
        for name in _imports(path):
            if not name.startswith("tailguard."):
                continue
            target = name.split(".")[1]
            if target == unit or target in CROSS_CUTTING:
                continue
            if unit == "cli":
                continue  # the CLI wires everything
            if unit in CROSS_CUTTING:
                wrong.append(f"{path.relative_to(ROOT)} imports {name} (cross-cutting modules "
                             "import nothing of tailguard's but each other)")
            elif target in TOOLS and unit not in TOOLS:
                wrong.append(f"{path.relative_to(ROOT)} imports the tool {name}")
            elif target not in ALLOWED.get(unit, set()):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_layers_never_import_what_they_must_not():
    wrong = []
    for path in FILES:
        forbidden = FORBIDDEN_THIRD_PARTY.get(_unit(path), set())
        for name in _imports(path):
            if name.split(".")[0] in forbidden:
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_api_imports_only_vllms_frontend_and_from_one_module():
    """The API validates and renders OpenAI requests with vLLM's own frontend, on the CPU: one
    module of the gateway imports it (the native API never does), and never an engine part."""
    wrong = []
    for path in [*FILES, *(ROOT / "app").rglob("*.py")]:
        rel = str(path.relative_to(ROOT))
        if not (rel.startswith(("app/", "tailguard/gateway/"))):
            continue
        for name in _imports(path):
            if name.split(".")[0] != "vllm":
                continue
            if rel != API_VLLM_MODULE:
                wrong.append(f"{rel} imports {name} (only {API_VLLM_MODULE} may)")
            elif not (name + ".").startswith(API_VLLM_PARTS) or name.startswith(VLLM_ENGINE_PARTS):
                wrong.append(f"{rel} imports {name}: not vLLM's frontend")
    assert not wrong, "\n".join(wrong)


def test_the_api_and_the_celery_app_import_no_tool():
    for folder in ("app", "tasks"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in _imports(path):
                assert name.split(".")[:2] not in (["tailguard", t] for t in TOOLS), (path, name)
                if folder == "app":
                    assert name.split(".")[0] not in ("vllm", "torch", "tasks"), (path, name)

"""The packages' import directions, as each package's __init__ states them.

Every import in the tree counts, function-level ones included: a lazy import is still a
dependency. A package may import itself and what ALLOWED lists; the cross-cutting
modules (errors, settings, sampling, loop_thread, openai_args) are open to all and import
nothing of tailguard's but each other. Third-party rules say what a layer must never pull in
(the engine no Redis or Celery; the API no torch, and of vLLM only its frontend, from one
module; pure policy no I/O client at all).

The API (app/) has its own table, APP_ALLOWED: its views ask the gateway through the modules
that give access to it and never import the ``app`` package itself. And no first-party
module (tailguard, app, tasks, celeryconfig) takes part in an import cycle, between packages
or inside one. The cycle check reads absolute and relative imports, function-level ones
too; imports under ``if TYPE_CHECKING:`` are left out (they never run), and so are a
package's implicit imports of its parents' ``__init__``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
    "batches": {"gateway", "jobs", "observe", "redis"},
    # tools: anything of the product, and only the CLI imports them
    "bench": {"redis", "host", "lanes", "model", "engine", "jobs", "observe", "gateway",
              "worker", "launch", "plan"},
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
    "batches": {"celery", "kombu", "flask", "vllm", "torch"},
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


# -- the API (app/) ---------------------------------------------------------------------

#: what a view (a blueprint) may import: the modules that give it the gateway, the caller and
#: the body, the error mapping, SSE framing, and the gateway's own package (CROSS_CUTTING too)
APP_VIEW_IMPORTS = {"app.gateway_ext", "app.auth", "app.body", "app.errors", "app.sse",
                    "tailguard.gateway"}
#: app/'s modules -> the first-party modules (or packages, by prefix) each may import, besides
#: tailguard's CROSS_CUTTING ones. A new module of app/ must be listed here.
APP_ALLOWED: dict[str, set[str]] = {
    # the composition root: settings, the one error mapping, the gateway, auth, blueprints
    "app": {"app.config", "app.errors", "app.gateway_ext", "app.auth", "app.jobs", "app.health",
            "app.openai_api", "app.openapi", "app.batches"},
    "app.config": set(),
    # builds the Gateway whole from the product's packages (the one module of app/ that does)
    "app.gateway_ext": {"tailguard.gateway", "tailguard.jobs", "tailguard.lanes", "tailguard.model",
                        "tailguard.observe", "tailguard.redis", "tailguard.batches"},
    "app.gunicorn_hooks": {"app.gateway_ext"},
    "app.auth": {"app.gateway_ext", "tailguard.gateway"},
    "app.body": set(),
    "app.sse": set(),
    # the error mapping: OpenAI's error shape, and Redis's out-of-memory reply
    "app.errors": {"app.gateway_ext", "tailguard.gateway.openai_errors", "tailguard.redis.client"},
    # the views
    "app.jobs": APP_VIEW_IMPORTS,
    "app.health": APP_VIEW_IMPORTS,
    "app.openai_api": APP_VIEW_IMPORTS,
    "app.batches": APP_VIEW_IMPORTS,
    "app.openapi": APP_VIEW_IMPORTS | {"tailguard.lanes.table"},  # the spec lists the priority classes
}

#: Import cycles that exist today, each left to the branch that restructures its package;
#: an entry allows a cycle among (a subset of) its modules. Remove an entry once its cycle
#: is gone; add none.
KNOWN_CYCLES: set[frozenset[str]] = set()
#: the same between packages (a top-level module counts as its own package)
KNOWN_PACKAGE_CYCLES: set[frozenset[str]] = set()


def _first_party() -> dict[str, Path]:
    """Every first-party module by its dotted name (a package by its __init__'s)."""
    files = [*(ROOT / "tailguard").rglob("*.py"), *(ROOT / "app").rglob("*.py"),
             *(ROOT / "tasks").rglob("*.py"), ROOT / "celeryconfig.py"]
    out = {}
    for path in files:
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _first_party()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST, type_checking: bool) -> Iterator[ast.AST]:
    """Every node of `tree`, function bodies included; without `if TYPE_CHECKING:` bodies
    unless `type_checking`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _module_of(name: str) -> str | None:
    """The first-party module `name` loads (its longest known prefix), or None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return None


def _edges(module: str, type_checking: bool) -> set[str]:
    """The first-party modules `module` imports: absolute and relative imports; ``from p
    import m`` is an import of the module p.m when there is one, else of p."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()
    for node in _statements(ast.parse(path.read_text()), type_checking):
        if isinstance(node, ast.Import):
            out.update(m for a in node.names if (m := _module_of(a.name)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                target = f"{source}.{alias.name}"
                found = target if target in MODULES else _module_of(source)
                if found:
                    out.add(found)
    out.discard(module)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of `graph` with more than one node (Tarjan's,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def _package(module: str) -> str:
    """A module's package: tailguard's by its subpackage (or top-level module), else its top."""
    parts = module.split(".")
    return parts[1] if parts[0] == "tailguard" and len(parts) > 1 else parts[0]


GRAPH = {module: _edges(module, type_checking=False) for module in MODULES}


def _unexplained(cycles: list[set[str]], known: set[frozenset[str]]) -> list[set[str]]:
    return [c for c in cycles if not any(c <= allowed for allowed in known)]


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_takes_part_in_an_import_cycle():
    wrong = _unexplained(_cycles(GRAPH), KNOWN_CYCLES)
    assert not wrong, "import cycles:\n" + "\n".join(
        f"{sorted(c)}: " + "; ".join(f"{m} -> {sorted(GRAPH[m] & c)}" for m in sorted(c))
        for c in wrong)


def test_no_package_takes_part_in_an_import_cycle():
    graph: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        graph.setdefault(_package(module), set()).update(
            _package(t) for t in targets if _package(t) != _package(module))
    wrong = _unexplained(_cycles(graph), KNOWN_PACKAGE_CYCLES)
    assert not wrong, f"package import cycles: {wrong}"


def test_every_module_of_the_api_is_in_its_table():
    assert {m for m in MODULES if m == "app" or m.startswith("app.")} == set(APP_ALLOWED)


def test_the_api_follows_its_import_directions():
    """Views ask the gateway (through app.gateway_ext, app.auth, app.body) and the error
    mapping; none of app/'s modules imports the ``app`` package itself (the factory imports
    its modules, never the other way: a cycle)."""
    wrong = []
    for module, allowed in APP_ALLOWED.items():
        for target in sorted(_edges(module, type_checking=True)):
            if target == "app":
                wrong.append(f"{module} imports the app package (import from its modules)")
            elif not (target in {f"tailguard.{m}" for m in CROSS_CUTTING}
                      or any(target == a or target.startswith(a + ".") for a in allowed)):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)

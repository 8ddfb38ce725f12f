"""The layers of ``search/`` import one way, without cycles and without hidden imports.

    cli -> handover -> report -> tuning -> compute -> record -> specs -> search -> contract
        -> errors

A module may import from its own layer and the layers below it, never above. The check reads
every ``import`` statement (module level, function level and under ``TYPE_CHECKING``) with
:mod:`ast`, so it needs no import of the package.

Some layers also keep out of a library (:data:`FORBIDDEN`): ``compute``, what a trial runs on
(placement, its job and context, limits, data-parallel processes, the memory probe), imports no
Ray Tune; the Tune wiring above it (``tuning``) does, the way Syne Tune keeps its backend apart
from the scheduler that decides.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "search"
LAYERS: list[tuple[str, ...]] = [
    ("__main__", "cli", "api", "result"),
    ("handover",),
    ("report",),
    ("tuning",),
    ("compute",),
    ("record",),
    ("specs",),
    ("testing", "keras", "lightning", "hf", "pytorch"),
    ("__init__",),
    ("contract",),
    ("errors",),
]
"""Top to bottom. ``compute`` sits under ``tuning`` (the Tune wiring: bridge, worker, scheduler,
the out-of-memory retry) and over ``record``, whose Optuna record it never needs; ``tuning`` and
``handover`` (confirmation runs, the final model, ``train``) build every trial's job and
limits from it. ``testing`` holds deterministic trainables for tests (like optuna.testing);
``keras`` and ``lightning`` adapt a user's ``model.fit`` / ``trainer.fit`` to the contract,
``pytorch`` a user's ``nn.Sequential`` to the built-ins' loop;
``__init__`` (the package root, ``search``) re-exports the public names from ``contract``;
modules inside the package import them from ``contract``."""
FORBIDDEN: dict[str, tuple[str, ...]] = {"compute": ("ray.tune",)}
"""Layer -> libraries none of its modules may import, anywhere (a module and its submodules)."""
LAZY_ALLOWED = {"search.cli", "search.__main__"}
"""Modules that may import ``search`` modules inside functions (to keep ``--help`` fast)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> tuple[set[str], set[str]]:
    """``(every search module imported, those imported inside a function)``."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    lazy: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
            names = [n for n in names if n == "search" or n.startswith("search.")]
            found.update(names)
            if in_function:
                lazy.update(names)
            visit(child, nested)

    visit(tree, False)
    return found, lazy


def every_import(source: str) -> set[str]:
    """Every module an ``import`` in ``source`` names, anywhere in it (``from a import b``
    names ``a`` and ``a.b``: ``b`` may be a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def forbidden(modules: Mapping[str, str]) -> list[str]:
    """``module -> library`` for every import of a library :data:`FORBIDDEN` to the module's
    layer; ``modules`` maps module names to their source."""
    found = []
    for name, source in modules.items():
        banned = FORBIDDEN.get(name.split(".")[1] if "." in name else "", ())
        found += [
            f"{name} -> {imported}"
            for imported in every_import(source)
            if any(imported == b or imported.startswith(b + ".") for b in banned)
        ]
    return sorted(found)


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Module -> the package's modules it imports (names that are not modules dropped)."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges, lazy = {}, {}
    for name, path in paths.items():
        found, inner = imports(path)
        edges[name] = {m for m in found if m in paths and m != name}
        lazy[name] = {m for m in inner if m in paths}
    return edges, lazy


def layer(module: str) -> int:
    first = module.split(".")[1] if "." in module else "__init__"
    for index, names in enumerate(LAYERS):
        if first in names:
            return index
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def upward(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import from a lower layer into a higher one."""
    return sorted(
        f"{a} -> {b}" for a, targets in edges.items() for b in targets if layer(b) < layer(a)
    )


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The cycles of the graph (one per strongly connected component of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_every_import_goes_down_the_layers() -> None:
    edges, _ = graph()
    assert upward(edges) == []


def test_the_import_graph_has_no_cycle() -> None:
    edges, _ = graph()
    assert cycles(edges) == []


def test_only_the_cli_imports_search_modules_inside_functions() -> None:
    _, lazy = graph()
    hidden = sorted(
        f"{m} -> {t}"
        for m, targets in lazy.items()
        for t in targets
        if targets and m not in LAZY_ALLOWED
    )
    assert hidden == []


def test_the_compute_layer_imports_no_ray_tune() -> None:
    sources = {module_name(p): p.read_text() for p in ROOT.rglob("*.py")}
    assert any(name.startswith("search.compute.") for name in sources)
    assert forbidden(sources) == []


@pytest.mark.parametrize(
    "source",
    [
        "from ray.tune import Callback",
        "from ray import tune",
        "def f():\n    import ray.tune.experiment",
        "if TYPE_CHECKING:\n    from ray.tune.experiment import Trial",
    ],
)
def test_the_forbidden_import_check_catches_ray_tune_in_compute(source: str) -> None:
    assert forbidden({"search.compute.limits": source}) != []
    assert forbidden({"search.compute.limits": "import ray\nimport ray.util"}) == []
    assert forbidden({"search.tuning.oom": source}) == []  # the Tune wiring may


def test_every_package_is_in_a_layer() -> None:
    for path in ROOT.rglob("*.py"):
        layer(module_name(path))


@pytest.mark.parametrize(
    ("edges", "problem"),
    [
        (
            {"search.specs.schema": {"search.tuning.runner"}},
            ["search.specs.schema -> search.tuning.runner"],
        ),
        (
            {"search.contract.driver": {"search.tuning.fate"}},
            ["search.contract.driver -> search.tuning.fate"],
        ),
        ({"search.tuning.runner": {"search.specs.schema"}}, []),
    ],
)
def test_the_layer_check_catches_an_upward_import(edges: dict, problem: list) -> None:
    assert upward(edges) == problem


def test_the_cycle_check_catches_a_cycle() -> None:
    edges = {
        "search.tuning.a": {"search.tuning.b"},
        "search.tuning.b": {"search.tuning.c"},
        "search.tuning.c": {"search.tuning.a"},
        "search.tuning.d": {"search.tuning.a"},
    }
    assert cycles(edges) == [["search.tuning.a", "search.tuning.b", "search.tuning.c"]]
    assert cycles({"search.tuning.a": {"search.tuning.b"}}) == []


def test_only_the_package_root_lists_public_names() -> None:
    """The public face is ``search/__init__.py``'s ``__all__``; an ``__all__`` in an internal
    layer's ``__init__`` would be a second one, which users would read as a promise."""
    internal = ("handover", "report", "tuning", "compute", "record", "specs", "contract")
    listing = []
    for package in internal:
        tree = ast.parse((ROOT / package / "__init__.py").read_text())
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                listing.append(package)
    assert listing == []


PAGE = ROOT.parent / "docs" / "architecture.md"


def commands() -> list[str]:
    """The names of the commands ``search/cli.py`` registers (``@app.command(...)``)."""
    names = []
    for node in ast.walk(ast.parse((ROOT / "cli.py").read_text())):
        for deco in getattr(node, "decorator_list", []):
            call = deco if isinstance(deco, ast.Call) else None
            func = call.func if call else deco
            if isinstance(func, ast.Attribute) and func.attr == "command":
                args = call.args if call else []
                named = [a.value for a in args if isinstance(a, ast.Constant)]
                names.append(named[0] if named else node.name)  # type: ignore[attr-defined]
    return names


def tree_block() -> str:
    """The page's file tree: its first ``text`` block."""
    return PAGE.read_text().split("```text", 1)[1].split("```", 1)[0]


def test_the_architecture_page_names_every_module_and_every_command() -> None:
    """The page a newcomer reads first tells the tree as it is: a module added or a command
    added without its line on the page fails here."""
    words = set(re.findall(r"[a-z_0-9]+", tree_block()))
    modules = {p.stem for p in ROOT.rglob("*.py") if p.stem != "__init__"}
    assert sorted(modules - words) == []
    names = commands()
    line = next(x for x in tree_block().splitlines() if x.strip().startswith("cli.py"))
    assert f"the {len(names)} commands" in line
    assert sorted(n for n in names if n not in words) == []


def test_the_command_reader_finds_a_named_and_a_plain_command() -> None:
    assert {"run", "trials", "register", "check"} <= set(commands())
    assert "trials_cmd" not in commands()

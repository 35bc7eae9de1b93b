"""The package's import graph: no cycle, and no module importing from a layer above its own.

Every ``idckit`` import counts, at module level or inside a function (a deferred import is still a dependency).
The layers, lowest first: what a newcomer can read bottom-up, each layer needing only the ones below it."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "idckit"

#: module-name prefix -> layer; the longest matching prefix wins, anything unlisted is an application (the top)
LAYERS = {
    "idckit": 0, "idckit.errors": 0, "idckit.paths": 0, "idckit.fileio": 0, "idckit.device": 0,
    "idckit.settings": 0, "idckit.registry": 0, "idckit.checkpoints": 0,
    "idckit.losses": 1, "idckit.train": 1,
    "idckit.models": 2,
    "idckit.data": 3, "idckit.text": 3.5,
    "idckit.eval": 4,
    "idckit.tasks": 5, "idckit.reports": 5,
    "idckit.experiments": 6,
    # what reads the experiments' results: the pages built from many reports, the authors' checkpoints as rows
    "idckit.reports.card": 7, "idckit.reports.index": 7, "idckit.reports.readme": 7, "idckit.reports.browser": 7,
    "idckit.authors": 7, "idckit.reproduce": 7, "idckit.cli": 7,
}
TOP = 7   # anything unlisted


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        rel = f.relative_to(PACKAGE.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = f
    return out


def _layer(module: str) -> int:
    if module in LAYERS:
        return LAYERS[module]
    best = max((p for p in LAYERS if module.startswith(p + ".")), key=len, default="idckit")
    return LAYERS[best] if best != "idckit" else TOP


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:      # relative: resolve against this module's package
                    base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [stem] + [f"{stem}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                # a package's own __init__ is not a dependency of its submodules
                if t and t != name and not (name.startswith(t + ".") and mods[t].name == "__init__.py"):
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_module_imports_from_a_layer_above_its_own():
    upward = sorted(f"{m} (layer {_layer(m)}) -> {d} (layer {_layer(d)})"
                    for m, deps in _graph().items() for d in deps if _layer(d) > _layer(m))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_checks_see_a_cycle_and_an_upward_import():
    """The walk itself: a planted cycle and a planted upward import are found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("idckit.data.features") == 3 and _layer("idckit.models.backbones") == 2
    assert _layer("idckit.cli") == TOP and _layer("idckit.experiments.base") == 6
    graph = _graph()
    assert "idckit.models.backbones" in graph["idckit.models.clip_loader"]     # function-level imports count
    assert "idckit.experiments.config" in graph["idckit.experiments.base"]


def test_the_package_top_level_holds_at_most_ten_modules():
    """The architecture is in the folders (reports/, authors/, cli/, reproduce/, ...), not in loose modules."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, f"{len(top)} modules at idckit/'s top level: {top}"


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_two_folders_import_each_other():
    """Folder by folder (idckit.data, idckit.text, ...), the imports form no cycle either: a folder never needs one
    that needs it back."""
    graph: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        graph.setdefault(_folder(m), set()).update(_folder(d) for d in deps if _folder(d) != _folder(m))
    for deps in list(graph.values()):
        for d in deps:
            graph.setdefault(d, set())
    cycles = _cycles(graph)
    assert not cycles, "folders importing each other: " + "; ".join(" <-> ".join(c) for c in cycles)
    assert _cycles({"idckit.data": {"idckit.text"}, "idckit.text": {"idckit.data"}}) == [["idckit.data",
                                                                                           "idckit.text"]]


#: in-function imports the package may hold at most: issue 48 counted 309 and asked for half; 79 after it
LOCAL_IMPORTS_AT_MOST = 85


def _local_imports() -> list[tuple[Path, int, bool]]:
    """(file, line, has a comment) of every import inside a function. A comment on the statement's lines counts, or
    one on the line just above the run of import statements it belongs to (one reason for a group)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))

        def visit(node, in_function):
            body_imports = []
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                    body_imports.append(child)
                visit(child, inner)
            first_of_run = None
            for i, imp in enumerate(body_imports):
                if i == 0 or body_imports[i - 1].end_lineno != imp.lineno - 1:
                    first_of_run = imp.lineno
                own = any("#" in lines[n - 1] for n in range(imp.lineno, imp.end_lineno + 1))
                above = lines[first_of_run - 2].strip().startswith("#") if first_of_run >= 2 else False
                out.append((path, imp.lineno, own or above))

        visit(tree, False)
    return out


def test_imports_inside_functions_are_few_and_each_says_why():
    """Imports sit at module level unless a measured start-up cost or an optional dependency says otherwise, and
    then a comment says which."""
    found = _local_imports()
    silent = [f"{p.relative_to(PACKAGE.parent)}:{line}" for p, line, why in found if not why]
    assert not silent, "imports inside functions without a comment saying why:\n" + "\n".join(silent)
    assert len(found) <= LOCAL_IMPORTS_AT_MOST, \
        f"{len(found)} imports inside functions (at most {LOCAL_IMPORTS_AT_MOST})"

"""The house's rules, read from the source: no import circles, every import points down the layers, no file over
500 lines, no measurement or history in a source comment. Each checker is also run on a planted violation."""
import ast
import io
import pathlib
import re
import tokenize

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tensorfold"

# The layers, bottom first: a module may import from its own layer and the layers below it, never above.
LAYERS = [
    ["errors"],
    ["numerics"],
    ["models"],
    ["device"],
    ["cuda"],
    ["contract"],
    ["backends"],
    ["model"],
    ["drafters"],
    ["prompt_cache", "grammar", "sampling", "request", "engine"],
    ["api", "__init__"],
    ["serve"],
    ["cli"],
]
MAX_LINES = 500


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, root: pathlib.Path, modules: set) -> set:
    """The package's modules that `path` imports, anywhere in the file (a function's import counts too)."""
    package = root.name
    here = module_name(path, root)
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.split(".") if is_package else here.split(".")[:-1]
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name: the module that defines it
                target = target.rpartition(".")[0]
            if target.split(".")[0] == package and target != here:
                found.add(target)
    return found


def import_graph(root: pathlib.Path) -> dict:
    files = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, root, modules) for p in files}


def circles(graph: dict) -> list:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for level, names in enumerate(LAYERS):
        if top in names:
            return level
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS")


def upward_imports(graph: dict) -> list:
    """(importer, imported) pairs where the imported module sits on a higher layer than its importer."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a))


def long_files(root: pathlib.Path, limit: int = MAX_LINES) -> list:
    return sorted(str(p.relative_to(root.parent)) for p in root.rglob("*.py")
                  if len(p.read_text().splitlines()) > limit)


# A measurement (a figure with a unit of time, speed or bandwidth, or a speed-up) or history (a receipt, a commit
# hash, a date) in a comment or docstring.
MEASUREMENT = re.compile(
    r"\d[\d,.]*\s*(ms|us|µs|ns|s a |tok/s|tokens/s|GB/s|TB/s|TOPS|GiB/s)\b"
    r"|\d[\d.]*\s*(x|times) (faster|slower)"
    r"|\breceipts?\b|\b20\d\d-\d\d-\d\d\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b")


def prose_of(path: pathlib.Path) -> list:
    """(line, text) of every comment and docstring in a file."""
    source = path.read_text()
    prose = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                prose.append((node.body[0].lineno, doc))
    return prose


def measurements_in_prose(root: pathlib.Path) -> list:
    return sorted(f"{p.relative_to(root.parent)}:{line}: {match.group(0)!r}"
                  for p in root.rglob("*.py") for line, text in prose_of(p)
                  for match in [MEASUREMENT.search(text)] if match)


def test_no_import_circles():
    assert circles(import_graph(PACKAGE)) == []


def test_every_import_points_down():
    assert upward_imports(import_graph(PACKAGE)) == []


def test_kernels_know_nothing_above_them():
    graph = import_graph(PACKAGE)
    above = {"tensorfold.model", "tensorfold.serve", "tensorfold.cli", "tensorfold.backends", "tensorfold.engine"}
    bad = [(a, b) for a, targets in graph.items() if a.startswith("tensorfold.cuda") for b in targets
           if any(b == top or b.startswith(top + ".") for top in above)]
    assert bad == []


def test_no_file_over_the_limit():
    assert long_files(PACKAGE) == []


def test_no_measurements_or_history_in_source_comments():
    assert measurements_in_prose(PACKAGE) == []


def plant(tmp_path, files: dict) -> pathlib.Path:
    root = tmp_path / "tensorfold"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_planted_violations_are_caught(tmp_path):
    root = plant(tmp_path, {
        "__init__.py": "",
        "cuda/__init__.py": "",
        "cuda/gemv.py": "from tensorfold.model import qwen35\n",
        "model/__init__.py": "",
        "model/qwen35.py": "def f():\n    from ..cuda import gemv\n",
        "numerics/__init__.py": "",
        "numerics/floats.py": "x = 1  # the sum took 1.95 ms on the GPU\n" + "\n" * MAX_LINES,
        "numerics/paths.py": '"""Chains, as in receipt limits (2026-12-01)."""\n',
    })
    graph = import_graph(root)
    assert graph["tensorfold.model.qwen35"] == {"tensorfold.cuda.gemv"}  # a relative import inside a function
    assert circles(graph) == [["tensorfold.cuda.gemv", "tensorfold.model.qwen35"]]
    assert upward_imports(graph) == [("tensorfold.cuda.gemv", "tensorfold.model.qwen35")]
    assert long_files(root) == ["tensorfold/numerics/floats.py"]
    found = measurements_in_prose(root)
    assert len(found) == 2 and "1.95 ms" in found[0] and "receipt" in found[1]


# The peer that `tensorfold bench --peer` runs beside us when it is installed (it says so when it is not).
PEER = {"torch", "transformers"}


def third_party_imports(root: pathlib.Path) -> set:
    """The top-level names of every module outside the standard library and the package that `root` imports."""
    import sys
    names = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            # numba.cuda is numba-cuda's (its module numba_cuda); every other name is its top-level package's
            names.update("numba_cuda" if m.startswith("numba.cuda") else m.split(".")[0] for m in modules)
    return {name for name in names if name not in sys.stdlib_module_names and name != root.name} - PEER


def undeclared(imports: set, declared: set) -> list:
    """The imported names whose distribution (as installed) is not among `declared` (normalized project names)."""
    from importlib.metadata import packages_distributions
    normal = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731 (PEP 503)
    provided = packages_distributions()
    return sorted(name for name in imports
                  if not any(normal(dist) in declared for dist in provided.get(name, [name])))


def declared_dependencies() -> set:
    import tomllib
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    return {re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[]", spec)[0]).lower() for spec in project["dependencies"]}


def test_every_import_of_the_package_is_a_declared_dependency():
    """What the package imports at run time is declared in [project.dependencies], test extras aside; the control:
    a package that imports httpx (the test extra's) is caught."""
    declared = declared_dependencies()
    assert undeclared(third_party_imports(PACKAGE), declared) == []
    assert undeclared({"httpx", "numpy"}, declared) == ["httpx"]


def test_every_declared_dependency_is_imported():
    """A dependency the package never imports is not declared (tests bring their own through the test extra)."""
    imported = third_party_imports(PACKAGE)
    from importlib.metadata import packages_distributions
    normal = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731 (PEP 503)
    provided = {normal(dist) for name in imported for dist in packages_distributions().get(name, [name])}
    assert sorted(declared_dependencies() - provided) == []

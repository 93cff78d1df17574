"""The direction of imports, as a contract that fails: read from the source with `ast`, so that
an import inside a function counts as much as one at the top (`make lint` runs this too).

- The core imports neither the launcher nor a binding; its one link to the launcher is the
  protocol between rrun and its ranks (`ringreduce.launcher.protocol`, standard library only).
- The launcher imports no framework and no binding.
- The layers of the core import only downward (or within their own layer).
- mpi4py is imported only by the modules that own MPI objects.
"""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Where each import name's source lives (pyproject.toml's package-dir).
PACKAGES = {
    "ringreduce": ROOT / "ringreduce",
    "ringreduce.launcher": ROOT / "launcher",
    "ringreduce.torch": ROOT / "bindings" / "torch",
    "ringreduce.tensorflow": ROOT / "bindings" / "tensorflow",
}
OUTSIDE_CORE = ("ringreduce.launcher", "ringreduce.torch", "ringreduce.tensorflow")
FRAMEWORKS = ("torch", "tensorflow", "keras", "cupy", "jax")
LAUNCHER_PROTOCOL = "ringreduce.launcher.protocol"

# The core's layers, top first; a module belongs to the first prefix it starts with.
LAYERS = (
    ("training", ("ringreduce.training",)),
    ("public API and resilience", ("ringreduce.checkpoint", "ringreduce.objects", "ringreduce.process_sets",
                                   "ringreduce.point_to_point", "ringreduce.collectives", "ringreduce.runtime",
                                   "ringreduce.build", "ringreduce.elastic", "ringreduce.resilience")),
    ("planning", ("ringreduce.planning",)),
    ("engine", ("ringreduce.engine",)),
    ("execution", ("ringreduce.execution",)),
    ("algorithms", ("ringreduce.algorithms",)),
    ("numerics", ("ringreduce.numerics",)),
    ("machine", ("ringreduce.machine",)),
    ("foundations", ("ringreduce.config", "ringreduce.ops", "ringreduce.errors")),
)
# Start-up, the state exchange, point-to-point transfers, plain allreduces in program order, the cost
# model's probe, the algorithms and what talks to the machine own MPI objects, and the exit hooks ask
# mpi4py to abort the job; the engine loop, the negotiation, fusion, execution and the other public
# API calls do not.
MPI_OWNERS = ("ringreduce.runtime", "ringreduce.point_to_point", "ringreduce.engine.plain_calls",
              "ringreduce.engine.wire", "ringreduce.planning.calibration", "ringreduce.resilience.exit_hooks",
              "ringreduce.algorithms", "ringreduce.machine")


def _modules():
    """{module name: path} of every module of the distribution."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if not any(name.startswith(other + ".") or name == other for other in PACKAGES if other != package
                       and other.startswith(package + ".")):
                found[name] = path
    return found


MODULES = _modules()


def _imports(name, path):
    """Every module `name` imports (absolute, with relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from ringreduce.engine import wire` imports the module ringreduce.engine.wire (the
            # package's __init__ too, which holds no code in this distribution's packages).
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
            yield from submodules or [base]


IMPORTS = {name: sorted(set(_imports(name, path))) for name, path in MODULES.items()}


def _within(module, prefixes):
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _layer(module):
    for index, (_, prefixes) in enumerate(LAYERS):
        if _within(module, prefixes):
            return index
    return None


def _core(module):
    return _within(module, ("ringreduce",)) and not _within(module, OUTSIDE_CORE) and module != "ringreduce"


def test_packages_hold_no_code_of_their_own():
    """What the contract assumes of `from package import module`; ringreduce/__init__.py is the
    public API and is checked as a module of its own."""
    for name, path in MODULES.items():
        if path.name == "__init__.py" and name != "ringreduce" and not name.startswith(OUTSIDE_CORE[1:]):
            body = ast.parse(path.read_text()).body
            assert all(isinstance(n, ast.Expr) for n in body), name


def test_the_contract_sees_the_whole_distribution():
    assert {"ringreduce.engine.loop", "ringreduce.launcher.cli", "ringreduce.torch.optimizer",
            "ringreduce.tensorflow.keras.callbacks"} <= set(MODULES)
    assert any("mpi4py" in found for found in IMPORTS.values())


def test_every_core_module_has_a_layer():
    assert [m for m in MODULES if _core(m) and _layer(m) is None] == []


def test_the_core_imports_neither_the_launcher_nor_a_binding():
    wrong = [(m, i) for m in MODULES if _core(m) or m == "ringreduce" for i in IMPORTS[m]
             if _within(i, OUTSIDE_CORE) and i != LAUNCHER_PROTOCOL]
    assert wrong == []


def test_the_launcher_protocol_needs_nothing_but_the_standard_library():
    assert [i for i in IMPORTS[LAUNCHER_PROTOCOL] if _within(i, ("ringreduce", "mpi4py", "numpy", "click"))] == []


def test_the_launcher_imports_no_framework():
    wrong = [(m, i) for m in MODULES if _within(m, ("ringreduce.launcher",)) for i in IMPORTS[m]
             if _within(i, FRAMEWORKS + ("ringreduce.torch", "ringreduce.tensorflow"))]
    assert wrong == []


def test_rrun_and_its_per_rank_wrapper_start_without_numpy():
    """numpy's import was half of their start (80 ms of 160), paid again by every rank of every job."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, ringreduce.launcher.cli, ringreduce.launcher.rank; "
                             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'mpi4py')))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_layers_of_the_core_import_only_downward():
    wrong = [(m, LAYERS[_layer(m)][0], i, LAYERS[_layer(i)][0]) for m in MODULES if _core(m)
             for i in IMPORTS[m] if _core(i) and _layer(i) is not None and _layer(i) < _layer(m)]
    assert wrong == []


def test_mpi4py_only_where_mpi_objects_live():
    wrong = [(m, i) for m in MODULES if (_core(m) or m == "ringreduce") and not _within(m, MPI_OWNERS)
             for i in IMPORTS[m] if _within(i, ("mpi4py",))]
    assert wrong == []


def _documented_name(module):
    """How docs/architecture.md names a module: its path under its component's folder."""
    for package, short in (("ringreduce.tensorflow", "tensorflow"), ("ringreduce.torch", "torch"),
                           ("ringreduce.launcher", "launcher"), ("ringreduce", "")):
        if _within(module, (package,)):
            rest = module[len(package) + 1:].replace(".", "/")
            return f"{short}/{rest}" if short else rest
    raise AssertionError(module)


def test_the_architecture_page_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    missing = [m for m, path in MODULES.items() if m not in packages and path.name != "__main__.py"
               and f"`{_documented_name(m)}`" not in text]
    assert missing == []


def test_the_core_top_level_shows_its_parts():
    """At most 12 modules beside the sub-packages, and each sub-package says in one line what it holds."""
    top = [p.name for p in PACKAGES["ringreduce"].glob("*.py")]
    assert len(top) <= 12, sorted(top)
    for init in PACKAGES["ringreduce"].glob("*/__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and "\n" not in docstring, init

"""docs/architecture.md and the import graph agree with each other and with the layering rules.

The graph is read with `ast` from specbench's own sources: `import specbench.x`, `from specbench.x
import y` (y a submodule or a name), relative imports, and `importlib.import_module("specbench.x")`
with a literal name, at module level and inside functions alike. Nothing is imported to build it.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specbench"
DOC = ROOT / "docs" / "architecture.md"

# The layers, bottom up. A module's layer is that of the longest prefix naming it (a module itself or a
# package and everything under it). Every module under specbench/ must have one: a new top-level
# module is placed here on purpose, not by default.
LAYERS = {
    # the base modules
    "specbench": 0,
    "specbench.errors": 0,
    "specbench.timing": 0,
    "specbench.markdown": 0,
    "specbench.intervals": 0,
    "specbench.draft": 0,
    "specbench.numerics": 0,
    "specbench.environment": 0,
    "specbench.registry": 0,
    "specbench.config": 0,
    "specbench.drafter": 0,
    # the packages
    "specbench.inputs": 1,
    "specbench.decoding": 2,
    "specbench.speculation": 3,
    "specbench.drafting": 4,
    "specbench.methods": 5,
    "specbench.run": 6,
    "specbench.report": 7,
    "specbench.main": 8,
}
# Beside the layers: may import anything below run/; nothing in specbench/ imports it (scripts and tests do).
TOOLS = "specbench.tools"

# Imports that break a layering rule today, each (importer, imported). The lead fixes them; until then
# they are allowed, and only they: a new violation fails, and so does an entry here that is gone.
KNOWN_VIOLATIONS = {
    # registry._load_builtin_methods: importlib.import_module("specbench.methods"), so that
    # drafter_class / available_methods find every method. Base layer -> methods.
    ("specbench.registry", "specbench.methods"),
}

# What a method may import: the draft types, the drafter protocol, registration, the errors, the
# drafting library, speculation and decoding utilities, and its own package's modules (the next rule).
# inputs.models too: a method that loads a model of its own (SpS's draft) or checks a datastore's
# tokenizer (REST) does so through the loaders every run uses, never through the run's settings
METHOD_MAY_IMPORT = ("specbench.draft", "specbench.drafter", "specbench.registry", "specbench.errors",
                     "specbench.drafting", "specbench.speculation", "specbench.decoding", "specbench.methods",
                     "specbench.inputs.models")
KNOWN_METHOD_IMPORTS: set = set()

# The run's settings: these modules, and these records of specbench.config, are read only inside run/
# and by the entry (specbench.main).
RUN_SETTINGS_MODULES = ("specbench.run.settings", "specbench.run.schemas", "specbench.run.plan")
RUN_SETTINGS_NAMES = {"RunConfig", "RunPlan"}
MAY_READ_RUN_SETTINGS = ("specbench.run", "specbench.main")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def resolve(name: str) -> str | None:
    """The module `name` runs: itself, or the nearest enclosing package that exists."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path) -> list[tuple[str, str]]:
    """(imported module, name) for every import of specbench in `path`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, a.name) for a in node.names if under(a.name, "specbench")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1 packages
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not under(source, "specbench"):
                continue
            for a in node.names:  # `from specbench.run import lossless`: the submodule, if it is one
                sub = f"{source}.{a.name}"
                found.append((sub if sub in modules() else source, a.name))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and under(node.args[0].value, "specbench")):
            found.append((node.args[0].value, node.args[0].value))
    return found


@cache
def graph() -> dict[tuple[str, str], frozenset[str]]:
    """(importer, imported) -> the names imported, over every module of specbench/."""
    edges: dict[tuple[str, str], set[str]] = {}
    for module, path in modules().items():
        for target, name in imports_of(module, path):
            resolved = resolve(target)
            if resolved and resolved != module:
                edges.setdefault((module, resolved), set()).add(name)
    return {k: frozenset(v) for k, v in edges.items()}


def layer(module: str) -> int:
    prefixes = [p for p in LAYERS if under(module, p)]
    assert prefixes, f"{module} has no layer: add it to LAYERS in tests/test_architecture.py and to docs/architecture.md"
    return LAYERS[max(prefixes, key=len)]


def described(pairs) -> str:
    g = graph()
    return "\n".join(f"  {a} -> {b} ({', '.join(sorted(g[a, b]))})" for a, b in sorted(pairs))


def test_the_graph_is_read():
    """The reader sees the imports it must (a reader that finds nothing would pass every rule)."""
    g = graph()
    for pair in [("specbench.decoding.engine", "specbench.draft"),  # module level
                 ("specbench.main", "specbench.run.single"),  # inside a function
                 ("specbench.main", "specbench.run.schemas"),  # from a package import a submodule
                 ("specbench.registry", "specbench.methods")]:  # importlib.import_module("...")
        assert pair in g, pair


def test_every_module_is_on_the_map_and_every_path_on_it_exists():
    doc = DOC.read_text()
    named = set(re.findall(r"specbench/[\w/]*\w\.py", doc))
    missing_files = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing_files, f"docs/architecture.md names files that do not exist: {missing_files}"
    unnamed = sorted(str(p.relative_to(ROOT)) for p in modules().values() if str(p.relative_to(ROOT)) not in named)
    assert not unnamed, f"modules missing from docs/architecture.md (one line each): {unnamed}"


def test_every_module_has_a_layer():
    for module in modules():
        if not under(module, TOOLS):
            layer(module)


def test_no_import_cycle():
    succ: dict[str, list[str]] = {}
    for a, b in graph():
        succ.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(succ.get(node, [])):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(modules()):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


def layer_violations() -> set[tuple[str, str]]:
    bad = set()
    for a, b in graph():
        if under(a, TOOLS):
            if not under(b, TOOLS) and layer(b) >= LAYERS["specbench.run"]:
                bad.add((a, b))  # tools/ imports only what lies below run/
        elif under(b, TOOLS):
            bad.add((a, b))  # nothing in specbench/ imports tools/
        elif layer(b) > layer(a):
            bad.add((a, b))
    return bad


def test_no_import_runs_up_a_layer():
    bad = layer_violations()
    new = bad - KNOWN_VIOLATIONS
    assert not new, "imports that run up a layer (docs/architecture.md, the rules):\n" + described(new)
    gone = KNOWN_VIOLATIONS - bad
    assert not gone, f"fixed, so remove from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_methods_import_only_the_drafter_interface_speculation_and_decoding():
    bad = {(a, b) for a, b in graph() if under(a, "specbench.methods")
           and not any(under(b, allowed) for allowed in METHOD_MAY_IMPORT)}
    new = bad - KNOWN_METHOD_IMPORTS
    assert not new, "a method imports outside the drafter interface, speculation and decoding:\n" + described(new)
    gone = KNOWN_METHOD_IMPORTS - bad
    assert not gone, f"fixed, so remove from KNOWN_METHOD_IMPORTS: {sorted(gone)}"


def method_package(module: str) -> str | None:
    """The method package a module belongs to (`specbench.methods.tr` for `specbench.methods.tr.fused`,
    `specbench.methods.pld` for itself), or None outside methods/ and for the package's own __init__."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) >= 3 and parts[:2] == ["specbench", "methods"] else None


def test_methods_never_import_one_another():
    """What two methods share lives in specbench/drafting/; a method package imports only its own modules."""
    bad = {(a, b) for a, b in graph()
           if method_package(a) and method_package(b) and method_package(a) != method_package(b)}
    assert not bad, "a method imports another method (move the shared piece to specbench/drafting/):\n" + described(bad)


def test_the_method_rule_sees_a_sideways_import():
    """The rule above would pass on a reader that found nothing: it names both sides of a real pair."""
    assert method_package("specbench.methods.tr.fused") == "specbench.methods.tr"
    assert method_package("specbench.methods.pld") == "specbench.methods.pld"
    assert method_package("specbench.methods") is None
    assert ("specbench.methods.tr.fused", "specbench.methods.tr.adaptive") in graph()  # within a package: allowed


def test_only_run_reads_the_run_settings():
    bad = set()
    for (a, b), names in graph().items():
        if any(under(a, p) for p in MAY_READ_RUN_SETTINGS):
            continue
        if any(under(b, m) for m in RUN_SETTINGS_MODULES) or (b == "specbench.config" and names & RUN_SETTINGS_NAMES):
            bad.add((a, b))
    assert not bad, "the run's settings read outside run/:\n" + described(bad)


def test_results_hold_what_is_current_in_at_most_600_files():
    """results/ on main is the current figures, not every sweep ever run (results/README.md lists what left
    main and the commit that still holds it); a superseded sweep or a folder of loose run files goes there."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = tracked.stdout.splitlines()
    assert 0 < len(files) <= 600, f"{len(files)} tracked files under results/: archive a sweep's run folders " \
                                  "(runs.tar.gz, runs.tar.xz) or let a superseded one leave main"


def test_the_checkout_leaves_room_for_the_weights_in_three_calls():
    """Every call to a GPU node carries the whole checkout (64 MiB in all): a checkout that grows past ~30 MiB
    pushes the embedded model's GGUF into a fourth call, which the rehearsal in CI refuses (results/README.md)."""
    import shutil

    import pytest

    from specbench.inputs.models import named_model_config
    from specbench.tools.gpu_node.limits import MAX_CALLS
    from specbench.tools.gpu_node.pack import plan_calls, tree_bytes

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    weights = named_model_config("smollm2-135m")["gguf"]["size"]
    fixed = 2 << 20  # the first call's wheels and Spec-Bench's questions (1.2 MiB on 2026-11-29), with room
    calls = plan_calls(tree_bytes(ROOT), fixed, weights)
    assert len(calls) <= MAX_CALLS, (f"the checkout is {tree_bytes(ROOT) / 2**20:.1f} MiB: the weights take {len(calls)} "
                                     f"calls, more than {MAX_CALLS}; archive run folders (results/README.md)")

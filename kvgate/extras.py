"""The optional parts of the install (pip extras), and the error a command gives without one.

`pip install kvgate` is the gateway; `kvgate[bench]` adds what the benchmark and simulator
commands need for charts and progress bars. Those imports stay inside the functions that use
them, so the gateway never loads them; a command that needs them checks first and says which
extra to install instead of failing with a traceback halfway through.
"""

from __future__ import annotations

import importlib.util

# extra → the modules kvgate imports from it (each distribution's import name is its own name)
EXTRAS: dict[str, tuple[str, ...]] = {
    "bench": ("matplotlib", "tqdm"),
}


class MissingExtra(RuntimeError):
    """A command needs an extra that is not installed."""

    def __init__(self, command: str, extra: str, module: str) -> None:
        super().__init__(
            f"kvgate {command} needs the {extra} extra: pip install 'kvgate[{extra}]' "
            f"(no module named {module!r})"
        )
        self.command, self.extra, self.module = command, extra, module


def require(command: str, extra: str) -> None:
    """Raises MissingExtra if a module of `extra` cannot be imported."""
    for module in EXTRAS[extra]:
        if not _importable(module):
            raise MissingExtra(command, extra, module)


def extra_providing(module: str | None) -> str | None:
    """The extra that brings `module` (or its top-level package), if any."""
    top = (module or "").partition(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it, or a parent package that fails to import
        return False

"""Running code as on an install that lacks some distributions (an extra not installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Wraps every import finder so that the top-level modules in BLOCKED are found by none of them:
# importlib.util.find_spec says None and `import` raises ModuleNotFoundError, as when absent.
HIDE = """\
import sys
BLOCKED = set({blocked!r})
class Hide:
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in BLOCKED:
            return None
        find = getattr(self.finder, 'find_spec', None)
        return None if find is None else find(name, path, target)
    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)
sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
for loaded in [m for m in sys.modules if m.partition('.')[0] in BLOCKED]:
    del sys.modules[loaded]
"""


def run_without(blocked: set[str], body: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs the Python source `body` in a fresh interpreter where `blocked` cannot be imported."""
    source = HIDE.format(blocked=sorted(blocked)) + body
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          timeout=120, cwd=cwd, stdin=subprocess.DEVNULL)

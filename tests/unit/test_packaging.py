"""The install: `pip install kvgate` is the gateway alone, a command that needs an extra names it,
`kvgate --version`, and the version bounds agree with what the committed stubs embed."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kvgate.extras import EXTRAS
from tests.support.missing import run_without

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

def _runtime_distributions() -> set[str]:
    """kvgate and everything `pip install kvgate` brings (no extras), by canonical name."""
    seen: set[str] = set()
    todo = ["kvgate"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # a marker-excluded or optional dependency that is not installed here
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def _outside_the_runtime() -> set[str]:
    """Top-level modules installed here only by extras (test tools, bench, grpcio-tools)."""
    runtime = _runtime_distributions()
    return {
        module for module, distributions in metadata.packages_distributions().items()
        if not any(canonicalize_name(d) in runtime for d in distributions)
    }


def test_version_is_the_distributions() -> None:
    result = subprocess.run([sys.executable, "-m", "kvgate_cli", "--version"], capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout == f"kvgate {metadata.version('kvgate')}\n"
    assert metadata.version("kvgate") == PYPROJECT["project"]["version"]


def test_the_gateway_needs_nothing_outside_its_dependencies() -> None:
    blocked = _outside_the_runtime()
    assert {"matplotlib", "tqdm", "grpc_tools", "pytest", "openai", "mypy"} <= blocked
    body = """
import importlib, pkgutil
from kvgate_cli.main import main
# run as files, with the bench extra
SCRIPTS = {'bench.gateway_bench', 'bench.emulator_bench', 'bench.session_bench'}
imported = 0
for package in ('kvgate', 'ext_proc', 'control_plane', 'emulator', 'workload', 'stack',
                'benchkit', 'simulator', 'bench', 'kvgate_cli'):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + '.'):
        if info.name.endswith('__main__') or info.name in SCRIPTS:
            continue
        importlib.import_module(info.name)
        imported += 1
print('imported', imported)
sys.exit(main(['check-config', 'examples/kvgate.yaml']))
"""
    result = run_without(blocked, body, ROOT)
    assert result.returncode == 0, result.stderr
    assert int(re.findall(r"imported (\d+)", result.stdout)[0]) > 100


@pytest.mark.parametrize(("argv", "extra"), [
    (["simulate", "--sessions", "4"], "bench"),
    (["bench", "--compare", "--sessions", "4"], "bench"),
])
def test_a_command_without_its_extra_names_it(argv: list[str], extra: str) -> None:
    result = run_without(set(EXTRAS[extra]), f"from kvgate_cli.main import main\n"
                                             f"sys.exit(main({argv!r}))", ROOT)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(
        f"kvgate {argv[0]} needs the {extra} extra: pip install 'kvgate[{extra}]'"
    ), result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""  # stopped before any work


def test_help_works_without_the_extras() -> None:
    result = run_without(set(EXTRAS["bench"]), "from kvgate_cli.main import main\n"
                                               "sys.exit(main(['simulate', '--help']))", ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kvgate simulate")


def test_an_undeclared_import_of_an_extra_still_names_it(tmp_path: Path) -> None:
    (tmp_path / "kvgate_test_chart_command.py").write_text(
        "def add_arguments(parser):\n    pass\n\n\n"
        "def run(args):\n    import matplotlib.pyplot\n    return 0\n"
    )
    body = (f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "from kvgate_cli import main as cli\n"
            "cli.COMMANDS['chart'] = ('kvgate_test_chart_command', 'draws a chart')\n"
            "sys.exit(cli.main(['chart']))\n")
    result = run_without({"matplotlib"}, body, ROOT)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ("kvgate chart needs the bench extra: pip install 'kvgate[bench]' "
                             "(no module named 'matplotlib')\n")


def test_the_extras_modules_come_from_the_extra() -> None:
    for extra, modules in EXTRAS.items():
        declared = {
            canonicalize_name(Requirement(line).name)
            for line in metadata.requires("kvgate") or []
            if Requirement(line).marker is not None
            and Requirement(line).marker.evaluate({"extra": extra})  # type: ignore[union-attr]
        }
        assert {canonicalize_name(m) for m in modules} <= declared, extra
        runtime = _runtime_distributions()
        assert not {canonicalize_name(m) for m in modules} & runtime, extra


def _generated_package() -> Path:
    spec = importlib.util.spec_from_file_location("kvgate_proto_generate_pins",
                                                  ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    (package_dir,) = set(generate.TARGETS.values())
    return ROOT / package_dir


def test_version_bounds_match_what_the_committed_stubs_embed() -> None:
    package = _generated_package()
    grpc_version = re.findall(r"^GRPC_GENERATED_VERSION = '([^']+)'$",
                              (package / "admin_pb2_grpc.py").read_text(), re.M)[0]
    protobuf_version = re.findall(r"^# Protobuf Python Version: (\S+)$",
                                  (package / "admin_pb2.py").read_text(), re.M)[0]
    runtime = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    test = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]]

    def bound(requirements: list[Requirement], name: str, operator: str) -> str:
        (spec,) = [s for r in requirements if r.name == name for s in r.specifier
                   if s.operator == operator]
        return spec.version

    # the generator is the one that wrote them; older runtimes than they name refuse them
    assert bound(test, "grpcio-tools", "==") == grpc_version
    assert bound(runtime, "grpcio", ">=") == grpc_version
    assert bound(runtime, "protobuf", ">=") == protobuf_version
    assert not any(r.name == "grpcio-tools" for r in runtime)


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    steps = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line and not line.startswith("#")]
    test_command = steps[-2]
    assert f"```bash\n{test_command}\n```" in readme
    assert "pip install -e '.[test]'" in test_command and "python -m pytest -q" in test_command
    # install, lint, type-check, the tests, then the chaos tier's short runs (left out of the
    # README's command, still gating)
    assert steps.index("python -m pip install --quiet -e '.[test]'") < steps.index(
        "ruff check .") < steps.index("mypy") < len(steps) - 2
    assert steps[-1] == "python -m pytest -q -m chaos tests/chaos"
    assert steps[-1] in readme
    # the quick start installs the gateway alone
    assert "pip install -e . && kvgate up\n" in readme

"""check-config against mutated configs: a seeded mutator (the same cases every run) breaks
valid files the ways editors, templates and attackers do. Every case must end with exit 0 and
OK, or exit 1 and only line-numbered problems: never a traceback, never a hang (the test's own
timeout bounds the whole run)."""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from kvgate.config import command as check_config

SEED = 14  # any fixed number: the same cases every run
CASES = 600
EXAMPLE = Path(__file__).parents[2] / "examples" / "kvgate.yaml"
MINIMAL = b"pools:\n  - name: coder\n    endpoints: [10.0.0.11:8000, 10.0.0.12:8000]\n"
TWO_POOLS = b"""\
pools:
  - name: a
    endpoints: [10.0.0.1:8000, {address: 10.0.0.2:8000, weight: 2}]
    health: {path: /health, interval: 2s, timeout: 1s}
  - name: b
    endpoints: ["[::1]:9000"]
routes:
  - {match: {prefix: /v1/, headers: {x-tenant: a}}, pool: a}
  - {match: {path: /v1/chat/completions}, pool: b, timeout: 0s}
"""
# What breaks YAML, or the values in it: structure, aliases, tags, types, control characters,
# huge or deep values, addresses and paths kvgate must refuse.
TOKENS = [
    b"", b"~", b"null", b"yes", b"on", b"0", b"-1", b"65536", b"1e999", b".nan", b".inf",
    b"2001-13-45", b"9" * 5000, b"[", b"]", b"{", b"}", b":", b"- ", b"? ", b"&a ", b"*a",
    b"*nope", b"<<: *a", b"!!python/object:os.system ", b"!!binary ", b"!!int x", b"\t",
    b"\x00", b"\r\n", b"\x85", b"\xef\xbb\xbf", b"\xff", "é".encode(), "\U0001f642".encode(),
    b'"', b"'", b"#", b"---\n", b"...\n", b"|", b">", b"%YAML 1.1\n", b"0.0.0.0", b"::",
    b"https://1.2.3.4:1", b"localhost:1", b'"/h\\r\\nX-Evil: 1"', b"[" * 300, b"{a: " * 200,
    b"listener: {port: 1}\n", b"pools: []\n", b"name: a\n", b"10.0.0.11:8000", b"/v1/",
]

Mutation = Callable[[random.Random, bytes], bytes]


def _span(rng: random.Random, data: bytes) -> tuple[int, int]:
    start = rng.randrange(len(data) + 1)
    return start, min(len(data), start + rng.randrange(1, 12))


def _replace(rng: random.Random, data: bytes) -> bytes:
    start, end = _span(rng, data)
    return data[:start] + rng.choice(TOKENS) + data[end:]


def _insert(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice(TOKENS) + data[at:]


def _delete(rng: random.Random, data: bytes) -> bytes:
    start, end = _span(rng, data)
    return data[:start] + data[end:]


def _flip(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    at = rng.randrange(len(data))
    return data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]


def _lines(mutate: Callable[[random.Random, list[bytes]], None]) -> Mutation:
    def apply(rng: random.Random, data: bytes) -> bytes:
        lines = data.split(b"\n")
        mutate(rng, lines)
        return b"\n".join(lines)
    return apply


def _duplicate_line(rng: random.Random, lines: list[bytes]) -> None:  # duplicate keys
    at = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[at])


def _swap_lines(rng: random.Random, lines: list[bytes]) -> None:
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]


def _indent(rng: random.Random, lines: list[bytes]) -> None:
    at = rng.randrange(len(lines))
    lines[at] = b" " * rng.randrange(1, 5) + lines[at] if rng.random() < 0.5 \
        else lines[at].lstrip(b" ")


def _value(rng: random.Random, lines: list[bytes]) -> None:  # a key's value replaced
    keyed = [i for i, line in enumerate(lines) if b": " in line]
    if keyed:
        at = rng.choice(keyed)
        key = lines[at].split(b": ", 1)[0]
        lines[at] = key + b": " + rng.choice(TOKENS)


def _nest(rng: random.Random, data: bytes) -> bytes:
    depth = rng.choice([10, 40, 2000])
    return data + b"deep: " + b"[" * depth + b"1" + b"]" * depth + b"\n"


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


MUTATIONS: list[Mutation] = [
    _replace, _insert, _delete, _flip, _lines(_duplicate_line), _lines(_swap_lines),
    _lines(_indent), _lines(_value), _nest, _truncate,
]


def cases() -> list[bytes]:
    rng = random.Random(SEED)
    seeds = [EXAMPLE.read_bytes(), MINIMAL, TWO_POOLS]
    out = []
    for _ in range(CASES):
        data = rng.choice(seeds)
        for _ in range(rng.randrange(1, 5)):
            data = rng.choice(MUTATIONS)(rng, data)
        out.append(data)
    return out


def _check(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = check_config.run(argparse.Namespace(file=str(path)))
    return code, out.getvalue(), err.getvalue()


def _assert_reported(path: Path, data: bytes, code: int, out: str, err: str) -> str:
    """The outcome's kind; fails unless it is OK or only line-numbered problems."""
    lines = data.count(b"\n") + 1
    problem = re.compile(rf"^{re.escape(str(path))}: (warning: )?line (\d+): \S")
    reported = err.splitlines()
    if code == 0:
        assert out.startswith(f"OK: {path}: "), (data, out, err)
    else:
        assert code == 1, (data, code, out, err)
        assert reported[-1].endswith("problem(s); nothing applied"), (data, err)
        reported = reported[:-1]
        assert reported, (data, err)
    for line in reported:
        found = problem.match(line)
        assert found is not None, (data, line)
        assert 1 <= int(found.group(2)) <= lines, (data, line)
    if code == 0:
        return "ok"
    first = reported[0].split(": ", 3)[-1]
    return first.split(":")[0] if first.startswith("not valid YAML") else "field"


@pytest.mark.timeout(300)
def test_mutated_configs_get_line_numbered_problems_never_a_traceback(tmp_path: Path) -> None:
    outcomes: Counter[str] = Counter()
    path = tmp_path / "kvgate.yaml"
    for data in cases():
        path.write_bytes(data)
        code, out, err = _check(path)
        outcomes[_assert_reported(path, data, code, out, err)] += 1
        if b"deep: " + b"[" * 2000 in data and code == 1:
            outcomes["nested too deep"] += "nested deeper than" in err
        outcomes["duplicate key"] += "duplicate key" in err
    # The mutator reached what matters: every kind of outcome, in numbers (loose bounds: the
    # cases change when examples/kvgate.yaml does).
    assert outcomes["ok"] >= 5, outcomes
    assert outcomes["field"] >= 50, outcomes
    assert outcomes["not valid YAML"] >= 50, outcomes
    assert outcomes["duplicate key"] >= 5, outcomes
    assert outcomes["nested too deep"] >= 5, outcomes


def test_the_real_command_on_hostile_files(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("pools: " + "[" * 100_000 + "\n")
    huge_number = tmp_path / "number.yaml"
    huge_number.write_text("listener: {port: " + "9" * 10_000 + "}\n")
    mutated = []
    for index, data in enumerate(cases()[:40:8]):
        mutated.append(tmp_path / f"case-{index}.yaml")
        mutated[-1].write_bytes(data)
    for path in [Path("/dev/zero"), deep, huge_number, *mutated]:
        result = subprocess.run(
            [sys.executable, "-m", "kvgate_cli", "check-config", str(path)],
            capture_output=True, text=True, check=False, timeout=60,  # a hang fails here
        )
        assert "Traceback" not in result.stderr, result.stderr
        if path in mutated:
            _assert_reported(path, path.read_bytes(), result.returncode, result.stdout,
                             result.stderr)
        else:
            assert result.returncode == 1, result
            assert result.stderr.endswith("1 problem(s); nothing applied\n"), result.stderr
    assert "the file is larger than 1024 KiB" in subprocess.run(
        [sys.executable, "-m", "kvgate_cli", "check-config", "/dev/zero"],
        capture_output=True, text=True, check=False, timeout=60,
    ).stderr

"""The P/D connector's handoff directory without vLLM (real_vllm/pd_store.py): a manifest only
once every block is written, removal on pull, expiry of what nobody pulled, ids that cannot
leave the directory, and the engine flags that attach the connector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_vllm.fleet import EngineOptions
from real_vllm.pd_store import MANIFEST, BadHandoff, Handoffs
from real_vllm.pd_transfer import PdTransfer
from real_vllm.shared_pool import REPO_ROOT

ENGINE = "0b7f6c1e-2f1d-4a57-9a39-3c6f0f5a7e11"


def test_a_written_request_is_read_back_block_by_block_then_removed(tmp_path: Path) -> None:
    store = Handoffs(tmp_path)
    assert store.manifest(ENGINE, "cmpl-1") is None
    written = store.write(ENGINE, "cmpl-1", [(7, b"a" * 8), (3, b"b" * 8)], tokens=200,
                          timeout_s=60)
    assert written == 16
    found = store.manifest(ENGINE, "cmpl-1")
    assert found is not None and (found.blocks, found.tokens) == ([7, 3], 200)
    assert store.read(ENGINE, "cmpl-1", 3) == b"b" * 8
    assert store.read(ENGINE, "cmpl-1", 4) is None
    assert store.remove(ENGINE, "cmpl-1") and not store.remove(ENGINE, "cmpl-1")
    assert store.manifest(ENGINE, "cmpl-1") is None
    # Reading a removed request does not create its directory again.
    assert store.read(ENGINE, "cmpl-1", 3) is None
    assert not store.directory(ENGINE, "cmpl-1").exists()


def test_no_manifest_until_every_block_is_written(tmp_path: Path) -> None:
    store = Handoffs(tmp_path)

    def blocks() -> list[tuple[int, bytes]]:
        # The manifest is not there while the blocks are still being written.
        assert store.manifest(ENGINE, "cmpl-2") is None
        return [(1, b"x")]

    store.write(ENGINE, "cmpl-2", iter(blocks()), tokens=1)
    assert store.manifest(ENGINE, "cmpl-2") is not None
    assert not list(store.directory(ENGINE, "cmpl-2").glob("*.part"))


def test_what_nobody_pulled_expires(tmp_path: Path) -> None:
    store = Handoffs(tmp_path)
    store.write(ENGINE, "old", [(1, b"x")], tokens=1, timeout_s=10)
    store.write(ENGINE, "new", [(2, b"y")], tokens=1, timeout_s=1000)
    cut_short = store.directory(ENGINE, "cut-short")
    cut_short.mkdir()  # a write that died before its manifest
    now = json.loads((store.directory(ENGINE, "old") / MANIFEST).read_text())["expires"]
    assert store.expire(ENGINE, now=now - 1, timeout_s=10) == []
    gone = store.expire(ENGINE, now=now + 1, timeout_s=10)
    assert sorted(gone) == ["cut-short", "old"]
    assert store.manifest(ENGINE, "new") is not None
    assert store.expire("another-engine") == []


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "", ".hidden", "a" * 300])
def test_ids_that_are_not_names_are_refused(tmp_path: Path, bad: str) -> None:
    store = Handoffs(tmp_path)
    with pytest.raises(BadHandoff, match="is not an id"):
        store.directory(ENGINE, bad)
    with pytest.raises(BadHandoff, match="engine id"):
        store.directory(bad, "cmpl-1")


def test_the_engine_flags_attach_the_connector_on_every_engine() -> None:
    with PdTransfer(pull_timeout_s=5) as transfer:
        options = transfer.engine_options(EngineOptions(extra_args=("--seed", "1")))
        assert options.python_path == str(REPO_ROOT)
        assert options.extra_args[:3] == ("--seed", "1", "--kv-transfer-config")
        config = json.loads(options.extra_args[3])
        assert config["kv_connector_module_path"] == "real_vllm.pd_connector"
        assert config["kv_load_failure_policy"] == "recompute"
        extra = config["kv_connector_extra_config"]
        assert extra["transfer_dir"] == str(transfer.transfers)
        assert extra["pull_timeout_s"] == 5
        assert transfer.pending() == []
        directory = transfer.directory
    assert not directory.exists()

"""The load gate end to end: real Envoy, etcd, ext_proc and control plane, emulated engines in
one DDR pool, a stock OpenAI client. A session whose engine gets busy (other traffic, sent to it
directly as another router would, seen only in the engine's own /metrics) moves to its DDR-pool
sibling with reason `load`, counted and shown by `kvgate sessions show`; with the gate off it
stays where it is."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from kvgate.contract import vllm
from tests.admin.admin_helpers import run_cli
from tests.support.fleet import EngineProcesses
from tests.support.polling import eventually
from tests.support.stack import gateway_config, running_stack

CODE = "def handler(event):\n    return event\n" * 150
SESSION = "dev-7-conversation-1"
FLOOD = 6  # requests sent straight to the session's engine, one slot: five of them wait


async def _metric(http: httpx.AsyncClient, url: str, name: str, labels: str = "") -> float:
    text = (await http.get(url)).text
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _turn(client: openai.AsyncOpenAI, model: str, messages: list[dict[str, str]]) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=4,  # type: ignore[arg-type]
        extra_headers={"x-session-id": SESSION})
    raw.parse()
    return raw.headers["x-engine-id"]


# The move needs the prompt's size (content-length, which Envoy must forward to ext_proc on
# either transport): without it every request is priced as empty and the queue looks short.
@pytest.mark.parametrize(("enabled", "transport"), [(True, "grpc"), (False, "grpc"),
                                                    (True, "http")],
                         ids=["gate-on", "gate-off", "gate-on-http"])
async def test_a_session_leaves_its_busy_engine_for_a_ddr_sibling(
    tmp_path: Path, prefix: str, enabled: bool, transport: str,
) -> None:
    # Real time (time scale 1) and one request slot per engine, so a few requests queue.
    fleet = EngineProcesses(2, tmp_path / "fleet", "--time-scale", "1", "--max-num-seqs", "1")
    await fleet.start()
    flood: list[asyncio.Task[httpx.Response]] = []
    stack_clients: list[openai.AsyncOpenAI] = []
    try:
        # The flood's prompts are ~1,000 tokens (0.2 s of prefill each), so its queue is worth
        # about a second: under the default min_saving_s (1.5 s, sized for real prompts).
        config = gateway_config(fleet.engines, prefix=prefix, transport=transport, placement={
            "load_gate": {"enabled": enabled, "refresh_s": "50ms", "min_saving_s": "300ms"}})
        async with running_stack(config, tmp_path / "stack") as stack, \
                httpx.AsyncClient(timeout=120) as http:
            client = openai.AsyncOpenAI(base_url=f"http://{config.listener}/v1",
                                        api_key="unused", max_retries=0, timeout=120)
            stack_clients.append(client)
            model = (await client.models.list()).data[0].id
            messages = [{"role": "system", "content": "You are a coding assistant.\n" + CODE},
                        {"role": "user", "content": "What does this code do?"}]
            home = await _turn(client, model, messages)
            assert await _turn(client, model, messages) == home  # sticky while all is calm
            sibling = next(e for e in fleet.engines if e != home)

            # Other traffic lands on its engine, not through this gateway.
            flood = [asyncio.create_task(http.post(
                f"http://{home}/v1/completions",
                json={"model": model, "prompt": f"other work {i} " + CODE, "max_tokens": 40}))
                for i in range(FLOOD)]

            async def waiting() -> float:
                text = (await http.get(f"http://{home}/metrics")).text
                return vllm.read_samples(text, [vllm.NUM_REQUESTS_WAITING]).get(
                    vllm.NUM_REQUESTS_WAITING, 0.0)

            await eventually(waiting, until=lambda n: n >= FLOOD - 2,
                             what="the session's engine has requests waiting")
            metrics = f"http://{stack.ext_proc_metrics[0]}/metrics"
            scrapes = 'kvgate_ext_proc_engine_scrapes_total'
            if enabled:  # two more rounds over both engines: ext_proc has seen the queue
                seen = await _metric(http, metrics, scrapes, '{result="ok"}')
                await eventually(lambda: _metric(http, metrics, scrapes, '{result="ok"}'),
                                 until=lambda n: n >= seen + 4, what="engine scrapes")
            else:  # the gate off scrapes nothing
                assert scrapes not in (await http.get(metrics)).text

            messages += [{"role": "assistant", "content": "It returns its argument."},
                         {"role": "user", "content": "And then?"}]
            served = await _turn(client, model, messages)
            load_rebinds = await _metric(http, metrics, "kvgate_ext_proc_rebinds_total",
                                         '{reason="load"}')
            listed = await run_cli("sessions", "show", SESSION,
                                   admin=str(config.control_plane.admin))
            assert listed.code == 0, listed.err
            shown = listed.out
            if enabled:
                assert served == sibling
                assert load_rebinds == 1.0
                assert sibling in shown and "load, " in shown, shown
            else:
                assert served == home
                assert load_rebinds == 0.0
                assert home in shown and "load" not in shown, shown
    finally:
        for opened in stack_clients:  # closed on every path, in this loop
            await opened.close()
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        await fleet.stop()

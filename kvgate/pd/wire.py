"""vLLM's two-stage wire: the prefill request made from the client's body, the prefill engine's
`kv_transfer_params` pasted verbatim into the body the decode engine gets.

As vLLM's proxy builds them (vllm-project/vllm
`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`, `send_request_to_service` and
`handle_completions`): the prefill is the client's body with `kv_transfer_params =
{do_remote_decode: true, do_remote_prefill: false, remote_engine_id/remote_block_ids/remote_host/
remote_port: null}`, `stream: false`, `max_tokens: 1` (and `max_completion_tokens: 1` when the
client set it), no `stream_options`; the decode request is the client's body, its `max_tokens`
and `stream` kept, plus the prefill answer's `kv_transfer_params`.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class PrefillFailed(Exception):
    """The prefill engine did not hand over its KV: the decode engine prefills the turn."""


def parse(body: bytes) -> dict[str, Any] | None:
    """The client's JSON object, or None (not JSON, not an object: sent on as it came)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def prefill_request(client: dict[str, Any]) -> dict[str, Any]:
    request = {**client, "kv_transfer_params": dict(PREFILL_PARAMS), "stream": False,
               "max_tokens": 1}
    if "max_completion_tokens" in request:
        request["max_completion_tokens"] = 1
    request.pop("stream_options", None)
    return request


def decode_request(client: dict[str, Any], params: dict[str, Any]) -> bytes:
    return compact({**client, "kv_transfer_params": params})


def compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


async def prefill(http: aiohttp.ClientSession, engine: str, path: str,
                  client: dict[str, Any], headers: dict[str, str],
                  timeout_s: float) -> dict[str, Any]:
    """Run the first stage on `engine` (ip:port): its `kv_transfer_params`, or PrefillFailed."""
    url = f"http://{engine}{path}"
    try:
        async with http.post(url, json=prefill_request(client), headers=headers,
                             timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            if reply.status != 200:
                raise PrefillFailed(f"{engine} answered {reply.status}")
            answer = await reply.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise PrefillFailed(f"{engine}: {type(exc).__name__}: {exc}") from exc
    params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        raise PrefillFailed(f"{engine} answered without kv_transfer_params")
    return params

"""Agents on the official Python SDKs (anthropic, openai) whose only integration with
tokenwarden is the base URL: `tokenwarden serve`'s path form names the fleet, quota, agent
and role. Runs N Anthropic agents (half streaming) and M OpenAI agents (Chat Completions,
and every third turn the Responses API) in threads, each a few turns, and prints one JSON line: calls made, errors (a 429 reaching an agent is one),
and the output tokens seen.

    python agents.py <origin> <fleet> <anthropic quota> <openai quota> <n> <m> <turns>
"""

import json
import sys
import threading

import anthropic
import openai

origin, fleet, aq, oq = sys.argv[1:5]
n, m, turns = (int(x) for x in sys.argv[5:8])
lock = threading.Lock()
result = {"calls": 0, "errors": [], "output_tokens": 0, "streamed": 0}


def record(tokens=0, streamed=False, error=None):
    with lock:
        if error is not None:
            result["errors"].append(error)
        else:
            result["calls"] += 1
            result["output_tokens"] += tokens
            result["streamed"] += int(streamed)


def claude(i):
    base = f"{origin}/v1/fleets/{fleet}/quotas/{aq}/agents/py-{i}/{'planner' if i == 0 else 'worker'}/anthropic"
    # The SDK's own retries stay on: they are for connection errors (a restart of the
    # limiter); a 429 never reaches it.
    client = anthropic.Anthropic(base_url=base, api_key="sk-test-python")
    for turn in range(turns):
        params = dict(
            model="claude-sonnet-4-6",
            max_tokens=200,
            messages=[{"role": "user", "content": f"agent {i} turn {turn} " + "lorem ipsum " * 250}],
        )
        try:
            if (i + turn) % 2 == 0:
                with client.messages.stream(**params) as stream:
                    final = stream.get_final_message()
                record(final.usage.output_tokens, streamed=True)
            else:
                msg = client.messages.create(**params)
                record(msg.usage.output_tokens)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            record(error=f"claude {i}: {type(e).__name__}: {e}")


def gpt(i):
    base = f"{origin}/v1/fleets/{fleet}/quotas/{oq}/agents/oa-{i}/worker/openai/v1"
    client = openai.OpenAI(base_url=base, api_key="sk-test-python")
    for turn in range(turns):
        params = dict(
            model="gpt-5",
            max_completion_tokens=200,
            messages=[{"role": "user", "content": f"agent {i} turn {turn} " + "lorem ipsum " * 200}],
        )
        try:
            if turn % 3 == 2:
                # The Responses API (what Codex and the Agents SDK speak), streamed by even
                # agents: usage comes with response.completed.
                ask = dict(model="gpt-5", max_output_tokens=200, input=params["messages"][0]["content"])
                if i % 2 == 0:
                    usage = None
                    for event in client.responses.create(**ask, stream=True):
                        if event.type == "response.completed":
                            usage = event.response.usage
                    record(usage.output_tokens if usage else 0, streamed=True)
                else:
                    r = client.responses.create(**ask)
                    record(r.usage.output_tokens)
            elif turn % 2 == 0:
                usage = None
                for chunk in client.chat.completions.create(**params, stream=True, stream_options={"include_usage": True}):
                    if chunk.usage is not None:
                        usage = chunk.usage
                record(usage.completion_tokens if usage else 0, streamed=True)
            else:
                r = client.chat.completions.create(**params)
                record(r.usage.completion_tokens)
        except Exception as e:  # noqa: BLE001
            record(error=f"gpt {i}: {type(e).__name__}: {e}")


threads = [threading.Thread(target=claude, args=(i,)) for i in range(n)]
threads += [threading.Thread(target=gpt, args=(i,)) for i in range(m)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(result))

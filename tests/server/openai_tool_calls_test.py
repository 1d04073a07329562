#!/usr/bin/env python3
"""Tool calls through the official `openai` client, deterministically: qflash_server_scripted
(a TEST-ONLY build of the real server whose generations replay the scripted answer in
tests/fixtures/server/tool_call_script.json, which the demo pair would never write) answers
whole and streamed chat completions; the client must see message.tool_calls, delta.tool_calls
that assemble into the same calls, no call markup in the text, and finish_reason "tool_calls"."""
import argparse
import json
import re

from openai import OpenAI

import pyserver

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                           "days": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "now", "description": "The time.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def independent_calls(text):
    """The calls in the scripted text, read without the server: (name, arguments) pairs."""
    return [(o["name"], o["arguments"]) for o in
            (json.loads(m.group(1)) for m in re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.S))]


def no_markup(text):
    for bit in ("<tool", "tool_call", "</tool", '"name"', '"arguments"', "get_weather"):
        assert bit not in text, (bit, text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="path to qflash_server_scripted")
    ap.add_argument("--script", required=True, help="the scripted answer (JSON)")
    a = ap.parse_args()
    with open(a.script) as f:
        script = json.load(f)
    want = [(c["name"], c["arguments"]) for c in script["expect"]["tool_calls"]]
    assert independent_calls("".join(script["pieces"])) == want, "the fixture's expectation disagrees with its text"
    srv = pyserver.Server(a.server, extra=("--script", a.script))
    c = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
    res = pyserver.Results()
    kw = dict(model="demo", messages=[{"role": "user", "content": "Weather in Paris, and the time?"}], tools=TOOLS)

    def whole():
        r = c.chat.completions.create(**kw)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch.finish_reason
        m = ch.message
        assert m.content == script["expect"]["content"], m.content
        no_markup(m.content)
        assert m.model_extra.get("reasoning_content") == script["expect"]["reasoning_content"], m.model_extra
        assert m.tool_calls, m
        got = [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls]
        assert got == want, got
        assert all(t.type == "function" and t.id.startswith("call_") for t in m.tool_calls), m.tool_calls
        assert len({t.id for t in m.tool_calls}) == len(m.tool_calls), m.tool_calls
        assert r.usage.model_extra["qflash"]["draft"] == "scripted", r.usage

    def streamed():
        chunks = list(c.chat.completions.create(stream=True, **kw))
        assert chunks[0].choices[0].delta.role == "assistant"
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert content == script["expect"]["content"], content
        no_markup(content)
        calls = {}
        for ch in chunks:
            for t in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                call = calls.setdefault(t.index, {"id": None, "type": None, "name": "", "arguments": ""})
                call["id"] = t.id or call["id"]
                call["type"] = t.type or call["type"]
                call["name"] += t.function.name or ""
                call["arguments"] += t.function.arguments or ""
        assert sorted(calls) == list(range(len(want))), calls
        got = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
        assert got == want, got
        assert all(v["type"] == "function" and v["id"].startswith("call_") for v in calls.values()), calls
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert finishes == ["tool_calls"], finishes

    try:
        res.run("whole_message_tool_calls", whole)
        res.run("streamed_delta_tool_calls", streamed)
    finally:
        srv.stop()
    res.finish()


if __name__ == "__main__":
    main()

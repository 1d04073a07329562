#!/usr/bin/env python3
"""The official `openai` Python client against qflash-server on the demo pair: completions and
chat, streamed and whole, stop strings, tools (rendering accepted, speculation on, tool results
and assistant tool calls in the history, forced calls), and errors mapped to the client's
exception types."""
import json
import re

import openai
from openai import OpenAI

import pyserver

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def parse_calls(text):
    """An independent reading of Qwen3 tool-call blocks: the calls that parse, and the rest."""
    calls, rest = [], text
    for m in re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.S):
        try:
            obj = json.loads(m.group(1))
            calls.append((obj["name"], obj.get("arguments", {})))
            rest = rest.replace(m.group(0), "")
        except (ValueError, KeyError, TypeError):
            pass
    return calls, rest


def main():
    a = pyserver.args()
    srv = pyserver.Server(a.server)
    c = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    res = pyserver.Results()

    def models():
        ids = [m.id for m in c.models.list().data]
        assert ids == ["demo"], ids

    def completion_stream_equals_whole():
        whole = c.completions.create(model="demo", prompt="def parse_args(", max_tokens=32)
        parts = list(c.completions.create(model="demo", prompt="def parse_args(", max_tokens=32, stream=True))
        text = "".join(p.choices[0].text for p in parts if p.choices)
        assert text == whole.choices[0].text, (text, whole.choices[0].text)
        assert whole.usage.completion_tokens > 0
        assert whole.usage.model_extra["qflash"]["draft"] == "dflash2", whole.usage
        assert parts[-1].choices[0].finish_reason in ("stop", "length")

    def chat_stream_role_and_text():
        msgs = [{"role": "user", "content": "import json"}]
        kw = dict(model="demo", messages=msgs, max_tokens=24, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        whole = c.chat.completions.create(**kw)
        chunks = list(c.chat.completions.create(stream=True, **kw))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == (whole.choices[0].message.content or ""), (text, whole.choices[0].message.content)
        assert whole.choices[0].finish_reason == chunks[-1].choices[0].finish_reason

    def stop_strings():
        full = c.completions.create(model="demo", prompt="class Stack:\n", max_tokens=40,
                                    extra_body={"ignore_eos": True}).choices[0].text
        stop = full[10:13]
        want = full[:full.index(stop)]
        got = c.completions.create(model="demo", prompt="class Stack:\n", max_tokens=40, stop=[stop],
                                   extra_body={"ignore_eos": True})
        assert got.choices[0].text == want and got.choices[0].finish_reason == "stop", (got.choices[0].text, want)
        streamed = "".join(p.choices[0].text for p in c.completions.create(
            model="demo", prompt="class Stack:\n", max_tokens=40, stop=stop, stream=True, extra_body={"ignore_eos": True}))
        assert streamed == want, (streamed, want)

    def tools_keep_speculation_and_history():
        msgs = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "reasoning_content": "Ask the tool.",
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
        kw = dict(model="demo", messages=msgs, tools=TOOLS, max_tokens=48,
                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        r = c.chat.completions.create(**kw)
        q = r.usage.model_extra["qflash"]
        assert q["draft"] == "dflash2" and q["tau"] > 1.0, q
        # The server's split of the answer agrees with an independent reading of its text.
        m = r.choices[0].message
        text = m.content or ""
        calls, _ = parse_calls(text)
        assert calls == [], "a call that parses was left as text"
        got = [(t.function.name, json.loads(t.function.arguments)) for t in (m.tool_calls or [])]
        assert r.choices[0].finish_reason == "tool_calls" if got else r.choices[0].finish_reason in ("stop", "length")
        chunks = list(c.chat.completions.create(stream=True, **kw))
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert streamed == text, (streamed, text)
        # The prompt holds the tools and the history: more tokens than without them.
        bare = c.chat.completions.create(model="demo", messages=msgs[:1], max_tokens=1,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert r.usage.prompt_tokens > bare.usage.prompt_tokens + 50, (r.usage.prompt_tokens, bare.usage.prompt_tokens)

    def forced_call():
        r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS,
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=24)
        m = r.choices[0].message
        if m.tool_calls:  # the model closed the call
            assert m.tool_calls[0].function.name == "get_weather"
            json.loads(m.tool_calls[0].function.arguments)
        else:  # cut off inside the call: the call's text, from the forced opening on
            assert m.content.startswith("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "), m.content
            assert r.choices[0].finish_reason == "length"

    def errors():
        for kw, exc in [(dict(model="gpt-4o", prompt="x"), openai.NotFoundError),
                        (dict(model="demo", prompt="x", n=2), openai.BadRequestError),
                        (dict(model="demo", prompt="x", max_tokens=5000), openai.BadRequestError),
                        (dict(model="demo", prompt="x", temperature=-1), openai.BadRequestError)]:
            try:
                c.completions.create(**kw)
            except exc as e:
                assert e.body and "message" in e.body, e.body
                continue
            raise AssertionError(f"{kw} was accepted")
        try:
            c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}], stream="yes")
        except openai.BadRequestError as e:
            assert e.body["param"] == "stream", e.body
        else:
            raise AssertionError("stream: 'yes' was accepted")

    try:
        for name, fn in [("models", models), ("completion_stream_equals_whole", completion_stream_equals_whole),
                         ("chat_stream_role_and_text", chat_stream_role_and_text), ("stop_strings", stop_strings),
                         ("tools_keep_speculation_and_history", tools_keep_speculation_and_history),
                         ("forced_call", forced_call), ("errors", errors)]:
            res.run(name, fn)
    finally:
        srv.stop()
    res.finish()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/chat_tools.json: OpenAI-style chat requests with tools, tool
calls and tool results, each with the prompt text transformers' apply_chat_template renders for
it from the Qwen3 chat template.

Run:  python tools/reference/chat_tools_fixture.py --tokenizer DIR
      (DIR holds the Qwen3 tokenizer.json and tokenizer_config.json; needs `transformers`)

Only conversations on which the Qwen3 template and the Qwen3.8 grammar (docs/spec) agree are
kept: the generation prompt with thinking off, and assistant turns after the last user message
that carry reasoning_content (Qwen3 drops the think block elsewhere; Qwen3.8 keeps it). The
server's request parser (tests/server/chat_tools_test.cpp) must render each request to exactly
this text.
"""
import argparse
import hashlib
import json
import os

from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "chat_tools.json")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "now", "description": "The time: \"HH:MM\"\n(24 h).", "parameters": {"type": "object", "properties": {}}},
}
NESTED = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900},
                                                            "score": {"type": "number", "default": 0.5}}},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}


def call(name, args, cid):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


CASES = [
    ("tools_system_user", {
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER, CLOCK]}),
    ("tools_user_only", {
        "messages": [{"role": "user", "content": "Time?"}],
        "tools": [CLOCK]}),
    ("tools_nested_unicode", {
        "messages": [{"role": "system", "content": "Réponds en français."},
                     {"role": "user", "content": "Cherche « qflash » 2024"}],
        "tools": [NESTED, WEATHER]}),
    ("tool_call_and_results", {
        "messages": [{"role": "user", "content": "Weather in Paris and the time?"},
                     {"role": "assistant", "content": "", "reasoning_content": "Two tools are needed.",
                      "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}", "call_1"),
                                     call("now", "{}", "call_2")]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                     {"role": "tool", "tool_call_id": "call_2", "content": "14:05"}],
        "tools": [WEATHER, CLOCK]}),
    ("tool_call_with_content", {
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": "Let me check.", "reasoning_content": "\nCall the tool.\n",
                      "tool_calls": [call("get_weather", "{\"city\": \"Oslo\", \"unit\": \"celsius\"}", "c1")]},
                     {"role": "tool", "tool_call_id": "c1", "content": "cold"}],
        "tools": [WEATHER]}),
    ("tool_call_arguments_object", {
        "messages": [{"role": "user", "content": "Search for GDN papers from 2025 tagged ml, nlp."},
                     {"role": "assistant", "content": "", "reasoning_content": "Search.",
                      "tool_calls": [call("search", {"query": "GDN", "filters": {"year": 2025, "score": 0.75},
                                                     "tags": ["ml", "nlp"]}, "c9")]},
                     {"role": "tool", "tool_call_id": "c9", "content": "3 results"}],
        "tools": [NESTED]}),
    ("content_parts", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "first part"},
                                                  {"type": "text", "text": "second part"}]}],
        "tools": [CLOCK]}),
]


def as_template_input(messages):
    """Content parts are joined with newlines by the server (as vLLM does) before templating."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="folder with the Qwen3 tokenizer.json and tokenizer_config.json")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    template = json.load(open(os.path.join(args.tokenizer, "tokenizer_config.json"), encoding="utf-8"))["chat_template"]
    cases = []
    for name, req in CASES:
        text = tok.apply_chat_template(as_template_input(req["messages"]), tools=req["tools"], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
        body = dict(req)
        body["chat_template_kwargs"] = {"enable_thinking": False}
        cases.append({"name": name, "request": body, "text": text})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/reference/chat_tools_fixture.py",
                   "note": "transformers apply_chat_template, Qwen3 template, enable_thinking=False",
                   "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()

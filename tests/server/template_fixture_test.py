#!/usr/bin/env python3
"""The chat-template fixture and its source belong together: tests/fixtures/tokenizer/chat_tools.json
(the prompts transformers renders with the Qwen3 chat template, which the server's renderer must
equal) names the template by its sha256, and the template itself is kept in the repository, in
tokenizer_config.json inside tests/fixtures/tokenizer/qwen3/qwen3-tokenizer.tar.xz. Fails when the
two differ (a fixture regenerated from another template, or the kept copy replaced) or when the
kept copy lacks what the tool rendering relies on. Standard library only."""
import hashlib
import json
import os
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOK = os.path.join(ROOT, "tests", "fixtures", "tokenizer")


def main():
    with tarfile.open(os.path.join(TOK, "qwen3", "qwen3-tokenizer.tar.xz")) as tar:
        config = json.load(tar.extractfile("tokenizer_config.json"))
    template = config["chat_template"]
    fixture = json.load(open(os.path.join(TOK, "chat_tools.json"), encoding="utf-8"))
    failures = []
    got = hashlib.sha256(template.encode("utf-8")).hexdigest()
    if got != fixture["template_sha256"]:
        failures.append(f"chat_tools.json was made from template {fixture['template_sha256']}, the kept copy is {got}")
    for needle in ("# Tools", "<tools>", "</tools>", "<tool_call>", "</tool_call>", "<tool_response>", "tojson"):
        if needle not in template:
            failures.append(f"the kept template has no {needle!r}")
    if not fixture.get("cases"):
        failures.append("chat_tools.json has no cases")
    for f in failures:
        print("[FAIL]", f)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

"""Greedy continuations of the shipped demo target by Hugging Face transformers (fp32).

Writes tests/fixtures/target/demo_greedy.json: for a few validation prompts, 48 greedy tokens
(argmax, lowest id on ties) computed with transformers' own Qwen3_5ForCausalLM, uncached (a full
forward per step), so the C++ engine's output on the real trained weights can be compared.

    python3 tools/reference/demo_greedy_fixture.py
"""
import json
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS, N_NEW = 6, 48


def main():
    demo = ROOT / "models" / "demo"
    model = AutoModelForCausalLM.from_pretrained(str(demo), dtype=torch.float32).eval()
    prompts = [json.loads(l) for l in (demo / "validation_prompts.jsonl").read_text().splitlines()[:N_PROMPTS]]
    cases = []
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([p["ids"]])
            out, margins = [], []
            for _ in range(N_NEW):
                logits = model(x).logits[0, -1]
                top2 = torch.topk(logits, 2).values
                t = int(torch.argmax(logits))
                out.append(t)
                margins.append(float(top2[0] - top2[1]))
                x = torch.cat([x, torch.tensor([[t]])], 1)
            cases.append({"prompt_ids": p["ids"], "greedy": out, "min_margin": min(margins)})
    dst = ROOT / "tests" / "fixtures" / "target" / "demo_greedy.json"
    dst.write_text(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {dst}; min margins {[round(c['min_margin'], 4) for c in cases]}")


if __name__ == "__main__":
    main()

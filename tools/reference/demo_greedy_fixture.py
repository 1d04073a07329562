"""Greedy continuations of the shipped demo target by Hugging Face transformers (fp32).

Writes tests/fixtures/target/demo_greedy.json: for a few validation prompts, 48 greedy tokens
(argmax, lowest id on ties) computed with transformers' own Qwen3_5ForCausalLM, uncached (a full
forward per step), so the C++ engine's output on the real trained weights can be compared.

An int4 pair (mlx layout: a "quantization" block in config.json, `W.weight` as uint32 words of 8
nibbles, column 8i+j at bits 4j, with `W.scales` / `W.biases` per group of columns) is expanded
first: w = q * scale + bias in float32 (what qflash's kernels compute before their own
accumulation), written to a temporary folder as an ordinary float32 checkpoint, and loaded from
there. transformers itself never sees the int4 words.

    python3 tools/reference/demo_greedy_fixture.py
"""
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS, N_NEW = 6, 48


def expand_int4(demo: Path, dst: Path) -> None:
    """An int4 (mlx layout) checkpoint in `demo` -> a float32 checkpoint in `dst`."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((demo / "config.json").read_text())
    q = cfg.pop("quantization")
    cfg.pop("quantization_config", None)
    if q.get("bits") != 4 or q.get("mode", "affine") != "affine":
        raise SystemExit(f"{demo / 'config.json'}: quantization {q}: only affine 4-bit is expanded")
    group = int(q["group_size"])
    raw = {}  # numpy: uint32 words as they are stored, everything else as float32
    for f in sorted(demo.glob("model*.safetensors")):
        for k, t in load_file(str(f)).items():
            u32 = t.dtype in (torch.int32, getattr(torch, "uint32", torch.int32))
            raw[k] = t.view(torch.int32).numpy().view(np.uint32) if u32 else t.float().numpy()
    out = {}
    for k, v in raw.items():
        if k.endswith((".scales", ".biases")):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base and base + ".scales" in raw:
            if v.dtype != np.uint32:
                raise SystemExit(f"{demo}: {k}: int4 words must be U32, found {v.dtype}")
            rows = v.shape[0]
            nib = (v[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & np.uint32(0xF)
            nib = nib.reshape(rows, -1, group).astype(np.float32)
            s = raw[base + ".scales"][..., None]
            b = raw[base + ".biases"][..., None]
            out[k] = torch.from_numpy(np.ascontiguousarray((nib * s + b).reshape(rows, -1)))
        else:
            out[k] = torch.from_numpy(np.ascontiguousarray(v))
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})


def main():
    demo = ROOT / "models" / "demo"
    tmp = Path(tempfile.mkdtemp(prefix="demo_fp32_"))
    src = demo
    if "quantization" in json.loads((demo / "config.json").read_text()):
        expand_int4(demo, tmp)
        src = tmp
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
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
    shutil.rmtree(tmp, ignore_errors=True)
    dst = ROOT / "tests" / "fixtures" / "target" / "demo_greedy.json"
    dst.write_text(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {dst}; min margins {[round(c['min_margin'], 4) for c in cases]}")


if __name__ == "__main__":
    main()

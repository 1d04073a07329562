"""Shared helpers for the qflash demo-model training pipeline (tools/train/).

Everything here is deliberately small: logging to stdout + OUT/train_log.txt,
seeding, stage markers, the tiny qwen3_5 target config, safetensors sharding,
and token-stream loading. See docs/experiments/demo_training.md.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REFERENCE_DIR = REPO / "tools" / "reference"

# ---------------------------------------------------------------------------
# Special tokens. BPE ids come first (0 .. N_BPE-1), specials are appended in
# this order, so with VOCAB_SIZE 8192 the mask token is id 8191 (the last id).
# ---------------------------------------------------------------------------
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>"]
N_BPE = VOCAB_SIZE - len(SPECIAL_TOKENS)  # 8186
EOT_ID = N_BPE + 0  # <|endoftext|>   8186
IM_START_ID = N_BPE + 1  # 8187
IM_END_ID = N_BPE + 2  # <|im_end|>       8188
THINK_ID = N_BPE + 3
END_THINK_ID = N_BPE + 4
MASK_ID = N_BPE + 5  # <|mask|>         8191

# Qwen3.5 split regex (qwen38.md 5.1).
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SHARD_LIMIT_BYTES = 16 * 1024 * 1024  # 16 MiB per safetensors file


# Target shapes (`--target-shape`). `tiny` is qwen38.md section 9 (the first demo pair, 11.6 M
# parameters). `small` is issue 16's larger target: about 2.2x the parameters, sized so that the
# int4 target (group 64) + bf16 MTP head + bf16 drafter stay under 32 MB; `nano` is a CPU dry-run
# shape only. Every shape keeps head_dim 64, full attention at every 4th layer and vocab 8192.
TARGET_SHAPES = {
    "tiny": dict(hidden=256, layers=8, inter=768, heads=4, kv=2, gdn_k=2, gdn_v=6),
    "small": dict(hidden=384, layers=12, inter=1152, heads=6, kv=2, gdn_k=3, gdn_v=6),
    "nano": dict(hidden=128, layers=8, inter=384, heads=2, kv=1, gdn_k=1, gdn_v=2),
}


def target_config_dict(shape: str = "tiny") -> dict:
    """qwen3_5 text config of one of TARGET_SHAPES."""
    if shape not in TARGET_SHAPES:
        raise SystemExit(f"--target-shape: expected one of {sorted(TARGET_SHAPES)}, found {shape!r}")
    sh = TARGET_SHAPES[shape]
    n_layers = sh["layers"]
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=sh["hidden"],
        intermediate_size=sh["inter"],
        num_hidden_layers=n_layers,
        num_attention_heads=sh["heads"],
        num_key_value_heads=sh["kv"],
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=4096,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        attention_bias=False,
        attention_dropout=0.0,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=sh["gdn_k"],
        linear_num_value_heads=sh["gdn_v"],
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layers)],
        attn_output_gate=True,
        mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False,
        pad_token_id=EOT_ID,
        bos_token_id=None,
        eos_token_id=[EOT_ID, IM_END_ID],
    )


def make_target_config(dtype: str | None = None, shape: str = "tiny"):
    from transformers import Qwen3_5TextConfig

    d = target_config_dict(shape)
    cfg = Qwen3_5TextConfig(**d)
    # transformers' Qwen3_5TextConfig keeps unknown kwargs as attributes; make sure
    # the values the engine reads are present even if a version drops them.
    for k in ("attn_output_gate", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"):
        if not hasattr(cfg, k):
            setattr(cfg, k, d[k])
    if dtype is not None:
        cfg.dtype = dtype
    return cfg


# ---------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------
class Log:
    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / "train_log.txt"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()

    def __call__(self, *args):
        msg = " ".join(str(a) for a in args)
        line = f"[{time.strftime('%H:%M:%S')} +{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed % (2**32))
    try:
        import torch

        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
    except ImportError:
        pass


def stage_seed(base: int, stage: str) -> int:
    h = hashlib.sha256(stage.encode()).digest()
    return (base * 1000003 + int.from_bytes(h[:4], "little")) % (2**31 - 1)


def pick_device(requested: str | None = None):
    import torch

    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast_ctx(device):
    """bf16 autocast on GPU; plain fp32 on CPU (smoke tests)."""
    import torch

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def setup_torch(device):
    import torch

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------
# Stage markers / JSON helpers
# ---------------------------------------------------------------------------
def write_json(path: Path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def stage_marker(out: Path, stage: str) -> Path:
    return Path(out) / "stages" / f"{stage}.json"


def stage_done(out: Path, stage: str) -> bool:
    return stage_marker(out, stage).exists()


def mark_stage(out: Path, stage: str, info: dict):
    write_json(stage_marker(out, stage), info)


def require_stage(out: Path, stage: str):
    if not stage_done(out, stage):
        raise SystemExit(f"stage '{stage}' has not been run in {out} (missing {stage_marker(out, stage)})")


# ---------------------------------------------------------------------------
# Token streams
# ---------------------------------------------------------------------------
def load_tokens(out: Path, split: str) -> np.ndarray:
    return np.load(Path(out) / "corpus" / f"tokens_{split}.npy", mmap_mode="r")


def random_windows(tokens: np.ndarray, n: int, length: int, gen: np.random.Generator) -> np.ndarray:
    """n random windows of `length` tokens from a packed stream (int64 [n, length])."""
    hi = len(tokens) - length
    if hi <= 0:
        raise ValueError(f"token stream too short ({len(tokens)}) for windows of {length}")
    starts = gen.integers(0, hi, size=n)
    idx = starts[:, None] + np.arange(length)[None, :]
    return np.asarray(tokens[idx.ravel()], dtype=np.int64).reshape(n, length)


# ---------------------------------------------------------------------------
# Safetensors writing (sharded, <= 16 MiB per file)
# ---------------------------------------------------------------------------
def tensor_nbytes(t) -> int:
    return t.numel() * t.element_size()


def save_sharded(tensors: dict, out_dir: Path, basename: str = "model", limit: int = SHARD_LIMIT_BYTES) -> list[str]:
    """Write `tensors` (name -> contiguous CPU torch tensor) as safetensors.

    One file `{basename}.safetensors` if it fits under `limit`, otherwise
    `{basename}-0000i-of-0000n.safetensors` + `{basename}.safetensors.index.json`
    (the transformers layout). Tensors keep insertion order; a tensor larger
    than the limit would get a shard of its own (none is, at this size).
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the safetensors header costs a few KiB; keep a margin
    budget = limit - 256 * 1024
    total = sum(tensor_nbytes(t) for t in tensors.values())
    if total <= budget:
        name = f"{basename}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / name), metadata={"format": "pt"})
        return [name]
    shards: list[dict] = [{}]
    size = 0
    for k, v in tensors.items():
        nb = tensor_nbytes(v)
        if shards[-1] and size + nb > budget:
            shards.append({})
            size = 0
        shards[-1][k] = v.contiguous()
        size += nb
    n = len(shards)
    names = []
    weight_map = {}
    for i, sh in enumerate(shards):
        name = f"{basename}-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(sh, str(out_dir / name), metadata={"format": "pt"})
        names.append(name)
        for k in sh:
            weight_map[k] = name
    write_json(
        out_dir / f"{basename}.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )
    for name in names:
        assert (out_dir / name).stat().st_size <= limit, name
    return names


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def import_reference(name: str):
    """Import tools/reference/<name>.py (mtp_ref, dflash2_ref)."""
    if str(REFERENCE_DIR) not in sys.path:
        sys.path.insert(0, str(REFERENCE_DIR))
    import importlib

    return importlib.import_module(name)


def fmt_s(sec: float) -> str:
    return f"{sec:.1f}s" if sec < 120 else f"{sec / 60:.2f}min"


# ---------------------------------------------------------------------------
# Target model helpers
# ---------------------------------------------------------------------------
def target_shape_of(out: Path) -> str:
    """The shape the `target` stage trained (recorded in target/shape.json), for later stages."""
    p = Path(out) / "target" / "shape.json"
    return read_json(p)["shape"] if p.exists() else "tiny"


def build_target(device=None, dtype=None, shape: str = "tiny"):
    import torch
    from transformers import Qwen3_5ForCausalLM

    cfg = make_target_config(shape=shape)
    try:
        cfg._attn_implementation = "sdpa"
    except Exception:
        pass
    model = Qwen3_5ForCausalLM(cfg)
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    return model


def load_target(out: Path, device, dtype=None):
    """The frozen target as trained (bf16-rounded weights) for the later stages."""
    import torch
    from safetensors.torch import load_file

    if dtype is None:
        # bf16 on GPU; on CPU (smoke tests) fp32 holding the same bf16-rounded values
        dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = build_target(shape=target_shape_of(out))
    q4 = Path(out) / "target" / "model_int4.safetensors"
    if q4.exists():  # --ship-int4: the later stages see the target as it ships
        group = read_json(Path(out) / "args.json").get("int4_group", 64)
        sd = {k: v.float() for k, v in dequantize_state_dict(load_file(str(q4)), group).items()}
    else:
        sd = load_file(str(Path(out) / "target" / "model.safetensors"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # rotary inv_freq buffers are not persistent; anything else missing is a bug
    if unexpected or [m for m in missing if "inv_freq" not in m]:
        raise RuntimeError(f"target load: missing {missing} unexpected {unexpected}")
    model = model.to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def cache_kwarg_name(model) -> str:
    """transformers >= 5.2x calls the cache argument `cache`, older 5.x `past_key_values`."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


class TapRecorder:
    """Forward hooks on decoder layers: raw residual-stream output of layer i
    (HF hidden_states[i+1]); the DFlash2 taps (dflash2.md 2.1)."""

    def __init__(self, model, layer_ids):
        self.layer_ids = list(layer_ids)
        self.out = {}
        self.handles = []
        layers = model.model.layers
        for i in self.layer_ids:
            self.handles.append(layers[i].register_forward_hook(self._hook(i)))

    def _hook(self, i):
        def fn(mod, inp, output):
            self.out[i] = output[0] if isinstance(output, tuple) else output

        return fn

    def taps(self):
        import torch

        return torch.cat([self.out[i] for i in self.layer_ids], dim=-1)

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


# ---------------------------------------------------------------------------
# int4 (mlx layout, the one `qflash quantize` writes and qflash loads): per group of `group`
# columns scale = bf16((max - min) / 15), bias = bf16(min), q = clamp(round_half_up((w - bias) /
# scale), 0, 15), 8 nibbles per uint32 with column j at bits 4j. Applied, like qflash's own
# quantizer, to every 2-D `.weight` without "norm" in its name whose columns divide by the group.
# ---------------------------------------------------------------------------
def int4_eligible(name: str, t, group: int) -> bool:
    return t.dim() == 2 and name.endswith(".weight") and "norm" not in name and t.shape[1] % group == 0


def int4_quantize(w, group: int = 64):
    """w [rows, cols] -> (q uint32-as-int32 [rows, cols/8], scales bf16, biases bf16)."""
    import torch

    rows, cols = w.shape
    x = w.detach().float().cpu().reshape(rows, cols // group, group)
    lo, hi = x.amin(-1), x.amax(-1)
    s16, b16 = ((hi - lo) / 15.0).to(torch.bfloat16), lo.to(torch.bfloat16)
    s, b = s16.float()[..., None], b16.float()[..., None]
    v = torch.where(s > 0, torch.floor((x - b) / s + 0.5), torch.zeros_like(x)).clamp(0, 15).to(torch.int64)
    v = v.reshape(rows, cols // 8, 8)
    q = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for j in range(8):
        q |= v[..., j] << (4 * j)
    q = torch.where(q >= 2**31, q - 2**32, q).to(torch.int32)  # same bits as uint32
    return q, s16, b16


def int4_dequantize(q, scales, biases, group: int = 64):
    import torch

    rows = q.shape[0]
    qq = q.to(torch.int64) & 0xFFFFFFFF
    v = torch.stack([(qq >> (4 * j)) & 0xF for j in range(8)], dim=-1).reshape(rows, -1, group).float()
    return (v * scales.float()[..., None] + biases.float()[..., None]).reshape(rows, -1)


def int4_state_dict(sd: dict, group: int = 64) -> dict:
    """Tensors as qflash stores an int4 checkpoint (safetensors has no uint32 in torch: the
    words are written as int32 and retagged U32 by `retag_u32`)."""
    out = {}
    for k, v in sd.items():
        if int4_eligible(k, v, group):
            q, s, b = int4_quantize(v, group)
            base = k[: -len(".weight")]
            out[k], out[base + ".scales"], out[base + ".biases"] = q, s, b
        else:
            out[k] = v
    return out


def dequantize_state_dict(sd: dict, group: int = 64) -> dict:
    import torch

    out = {}
    for k, v in sd.items():
        if k.endswith((".scales", ".biases")):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base and base + ".scales" in sd:
            out[k] = int4_dequantize(v, sd[base + ".scales"], sd[base + ".biases"], group).to(torch.bfloat16)
        else:
            out[k] = v
    return out


def retag_u32(path: Path, names) -> None:
    """Rewrite the dtype of `names` in a safetensors header from I32 to U32 (same bytes)."""
    import struct

    path = Path(path)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8 : 8 + n])
    for k in names:
        if k in hdr:
            assert hdr[k]["dtype"] in ("I32", "U32"), (k, hdr[k]["dtype"])
            hdr[k]["dtype"] = "U32"
    new = json.dumps(hdr, separators=(",", ":")).encode()
    new += b" " * (n - len(new))  # same length: "U32" and "I32" are the same size
    assert len(new) == n
    path.write_bytes(raw[:8] + new + raw[8 + n :])

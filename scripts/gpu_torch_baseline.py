#!/usr/bin/env python3
"""PyTorch baselines for scripts/gpu-check.sh: the workloads kiln benchmarks, in eager mode and under torch.compile.

`gpu_torch_baseline.py --json OUT.json [--budget-s S] [--runs N] [--warmup N] [--only NAME,...]`

Workloads (random weights, f32, eval, no_grad, TF32 off so f32 means f32 on both sides):
  fused_gelu    y = gelu(x*a + b) + r, x and r [4096, 4096], a and b [4096]
  resnet18      torchvision resnet18, batch 1, 3x224x224
  resnet18_b32  the same, batch 32
  bert_small    transformers BertModel: hidden 256, 4 layers, 4 heads, intermediate 1024, vocab 8192, seq 128
  gpt2_small    transformers GPT2LMHeadModel: 4 layers, n_embd 256, 4 heads, vocab 4096, seq 32
Inputs live on the device; each timing is the median of N runs after warmup, measured with CUDA events. Every
workload and mode is guarded: a failure is recorded (`eager_error`, `compile_error`) and the rest go on. Eager runs
first for all workloads, then torch.compile (whose first call, the compilation, is timed apart as
`compile_first_call_s`), skipped once the budget runs low. The JSON is rewritten after every measurement, so a
run stopped by a timeout keeps what it measured.
"""

import argparse
import json
import statistics
import sys
import time
import traceback

WORKLOADS = ["fused_gelu", "resnet18", "resnet18_b32", "bert_small", "gpt2_small"]


def disable_tf32(torch):
    """TF32 off for matmuls and convolutions: the new API (torch >= 2.9), else the legacy flags. Returns how."""
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        return "fp32_precision=ieee"
    except (AttributeError, RuntimeError):
        pass
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        return "allow_tf32=False"
    except (AttributeError, RuntimeError) as e:
        return f"could not turn TF32 off: {e}"


def build(name, torch):
    """(callable, args) of a workload, on the GPU."""
    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    if name == "fused_gelu":
        n = 4096
        x, r = (torch.rand(n, n, generator=g) * 2 - 1 for _ in range(2))
        a, b = (torch.rand(n, generator=g) * 2 - 1 for _ in range(2))

        def fused(x, a, b, r):
            return torch.nn.functional.gelu(x * a + b) + r

        return fused, [t.to(dev) for t in (x, a, b, r)]
    if name.startswith("resnet18"):
        import torchvision

        torch.manual_seed(0)
        batch = 32 if name == "resnet18_b32" else 1
        model = torchvision.models.resnet18(weights=None).eval().to(dev)
        return model, [torch.rand(batch, 3, 224, 224, generator=g).to(dev)]
    if name == "bert_small":
        import transformers

        torch.manual_seed(0)
        cfg = transformers.BertConfig(
            hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=8192
        )
        model = transformers.BertModel(cfg).eval().to(dev)
        ids = torch.randint(0, 8192, (1, 128), generator=g)
        mask = torch.ones(1, 128, dtype=torch.int64)
        mask[:, 96:] = 0  # as the reference input: 96 tokens, 32 padding

        def bert(ids, mask):
            return model(input_ids=ids, attention_mask=mask).last_hidden_state

        return bert, [ids.to(dev), mask.to(dev)]
    if name == "gpt2_small":
        import transformers

        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=4096)
        model = transformers.GPT2LMHeadModel(cfg).eval().to(dev)

        def gpt2(ids):
            return model(input_ids=ids, use_cache=False).logits

        return gpt2, [torch.randint(0, 4096, (1, 32), generator=g).to(dev)]
    raise ValueError(f"unknown workload {name}")


def time_ms(torch, fn, args, warmup, runs):
    """Median and min of `runs` timed calls (CUDA events) after `warmup` untimed ones."""
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--budget-s", type=float, default=400, help="stop starting new measurements after this long")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--only", help="comma-separated workloads (default: all)")
    a = p.parse_args()
    t0 = time.monotonic()
    result = {"workloads": {}}

    def save():
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)

    try:
        import torch
    except ImportError as e:
        result["error"] = f"torch does not import: {e}"
        save()
        return 1
    result["torch"] = torch.__version__
    if not torch.cuda.is_available():
        result["error"] = "torch sees no CUDA device"
        save()
        return 1
    result["device"] = torch.cuda.get_device_name(0)
    result["tf32"] = disable_tf32(torch)
    names = a.only.split(",") if a.only else WORKLOADS
    built = {}
    for name in names:
        entry = result["workloads"].setdefault(name, {})
        try:
            with torch.no_grad():
                built[name] = build(name, torch)
                fn, args = built[name]
                entry["eager_ms"], entry["eager_min_ms"] = time_ms(torch, fn, args, a.warmup, a.runs)
            print(f"{name}: eager {entry['eager_ms']:.3f} ms", flush=True)
        except Exception as e:  # noqa: BLE001 — one workload's failure must not stop the rest
            entry["eager_error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
        save()
    for name in names:
        entry = result["workloads"][name]
        if name not in built:
            continue
        left = a.budget_s - (time.monotonic() - t0)
        if left < 60:
            entry["compile_error"] = f"skipped: {left:.0f} s of the budget left"
            save()
            continue
        try:
            fn, args = built[name]
            compiled = torch.compile(fn)
            with torch.no_grad():
                t = time.monotonic()
                compiled(*args)
                torch.cuda.synchronize()
                entry["compile_first_call_s"] = time.monotonic() - t
                entry["compile_ms"], entry["compile_min_ms"] = time_ms(torch, compiled, args, a.warmup, a.runs)
            print(f"{name}: torch.compile {entry['compile_ms']:.3f} ms", flush=True)
        except Exception as e:  # noqa: BLE001
            entry["compile_error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
        save()
    result["elapsed_s"] = time.monotonic() - t0
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

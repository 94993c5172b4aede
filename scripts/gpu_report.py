#!/usr/bin/env python3
"""Gathers what scripts/gpu-check.sh left in OUT_DIR into OUT_DIR/gpu-check.json and OUT_DIR/gpu-check.md.

Reads gpu.txt (nvidia-smi's line), bundle.json, conformance/*.json (scripts/gpu_compare.py's verdicts),
bench/*.json (`kiln bench --json`'s last line) and torch.json (scripts/gpu_torch_baseline.py). Standard library only.
"""

import glob
import json
import os
import sys

# Workloads benchmarked, in table order, with what the kiln artifact and the torch baseline call them.
WORKLOADS = [
    ("fused_gelu", "y = gelu(x*a + b) + r, 16M f32"),
    ("resnet18", "resnet18, batch 1"),
    ("resnet18_b32", "resnet18, batch 32"),
    ("bert_small", "bert_small, seq 128"),
    ("gpt2_small", "gpt2_small, seq 32"),
]


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def ms(v):
    return f"{v:.3f}" if isinstance(v, (int, float)) else "–"


def main(out):
    gpu = open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else None
    conformance = [read_json(p) for p in sorted(glob.glob(os.path.join(out, "conformance", "*.json")))]
    conformance = [c for c in conformance if c]
    bench = {os.path.basename(p)[:-5]: read_json(p) for p in glob.glob(os.path.join(out, "bench", "*.json"))}
    torch = read_json(os.path.join(out, "torch.json"), {})
    rows = []
    for key, what in WORKLOADS:
        k, t = bench.get(key) or {}, (torch.get("workloads") or {}).get(key) or {}
        notes = []
        # The steps' own time (inputs resident, outputs left on the device) where the bench measured it; else the
        # whole run, host<->device copies included.
        ms = k.get("device_median_ms") or k.get("median_ms")
        resident = k.get("device_median_ms") is not None
        if k.get("device_copy_gbps") and k.get("io_bytes") and ms:
            gbps = k["io_bytes"] / (ms / 1e3) / 1e9
            pct = 100 * gbps / k["device_copy_gbps"]
            k["achieved_gbps"], k["copy_fraction"] = gbps, pct / 100
            if key == "fused_gelu":
                notes.append(
                    f"{gbps:.0f} GB/s = {pct:.0f}% of the device copy ({k['device_copy_gbps']:.0f} GB/s; target ≥80%: "
                    + ("met" if pct >= 80 else "not met")
                    + ("); kernel time, data resident on the device" if resident
                       else "); kiln's time includes host↔device copies of inputs and outputs")
                )
        if key == "fused_gelu":
            # reads x and r, writes y: 3 x 64 MiB, inputs already on the device
            moved = 3 * 4096 * 4096 * 4
            for side in ("eager", "compile"):
                if t.get(f"{side}_ms"):
                    notes.append(f"torch {side} {moved / (t[f'{side}_ms'] / 1e3) / 1e9:.0f} GB/s (kernel only)")
        for side in ("eager", "compile"):
            if t.get(f"{side}_error"):
                notes.append(f"torch {side}: {t[f'{side}_error']}")
        if k.get("error"):
            notes.append(f"kiln bench failed: {k['error']}")
        if not k and not t:
            notes.append("not in this bundle")
        rows.append(
            {
                "workload": key,
                "what": what,
                "kiln_ms": k.get("median_ms"),
                "kiln_device_ms": k.get("device_median_ms"),
                "torch_eager_ms": t.get("eager_ms"),
                "torch_compile_ms": t.get("compile_ms"),
                "notes": "; ".join(notes),
            }
        )
    passed = sum(1 for c in conformance if c.get("ok"))
    report = {
        "gpu": gpu,
        "bundle": read_json(os.path.join(out, "bundle.json")),
        "conformance": {"passed": passed, "failed": len(conformance) - passed, "cases": conformance},
        "bench": bench,
        "torch": torch,
        "table": rows,
    }
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump(report, f, indent=1)
    lines = [
        "# kiln GPU check",
        "",
        f"GPU: {gpu or 'unknown'}"
        + (f"; torch {torch.get('torch')}" if torch.get("torch") else "")
        + (f"; torch baseline: {torch['error']}" if torch.get("error") else ""),
        "",
        f"Conformance: {passed} passed, {len(conformance) - passed} failed (rtol 1e-3, atol 1e-4; integers exact).",
        "",
    ]
    fails = [f"- FAIL {c['name']}: {c.get('why')}" for c in conformance if not c.get("ok")]
    lines += fails + ([""] if fails else [])
    lines += [
        "Median latency (ms); kiln: `kiln bench` on the CUDA artifact — a whole run (inputs copied in, outputs "
        "copied out) and the steps alone (data resident on the device, as torch's is); torch: f32, TF32 off, eval, "
        "no_grad, inputs already on the device.",
        "",
        "| workload | kiln run ms | kiln on device ms | torch eager ms | torch.compile ms | notes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['what']} | {ms(r['kiln_ms'])} | {ms(r['kiln_device_ms'])} | {ms(r['torch_eager_ms'])} | "
        f"{ms(r['torch_compile_ms'])} | {r['notes']} |"
        for r in rows
    ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "gpu-check.md"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_report.py OUT_DIR")
    main(sys.argv[1])

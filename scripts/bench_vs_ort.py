#!/usr/bin/env python3
"""kiln against ONNX Runtime on the shared reference models, in one run, alternating the two.

For each model and thread count, the script runs `kiln bench --json` and an ONNX Runtime session (all graph
optimizations, the same thread count, the model's saved inputs) in alternating rounds, so machine noise hits both
alike, and reports median latencies, their ratio, kiln's compile time (import to executable), the time it takes binding the
weights (prepare steps and packing) beside ONNX Runtime's session creation, and both peak RSS figures.

    .venv/bin/python scripts/bench_vs_ort.py [--models resnet18,bert_small,...] [--threads 1,2] [--rounds 3]
    .venv/bin/python scripts/bench_vs_ort.py --models '' --corpus sym_resnet18,stress_symbolic_vision

Needs `onnxruntime` and `numpy` in the venv (`scripts/test.sh` creates `.venv`; `pip install onnxruntime`), and a
release build (`cargo build --release`). Prints a Markdown table (paste it into docs/performance.md), then the
geometric mean of kiln/ORT and the worst case per thread count.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kiln_bench(kiln, case, threads, runs, warmup):
    model, inputs = case
    manifest = json.loads((inputs / "manifest.json").read_text())
    cmd = [str(kiln), "bench", str(model), "--threads", str(threads), "--runs", str(runs),
           "--warmup", str(warmup), "--json"]
    for entry in manifest:
        cmd += ["--input", f"{entry['name']}={inputs / entry['file']}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


ORT_CHILD = r"""
import json, sys, time, numpy as np, onnxruntime as ort
from pathlib import Path
model, inputs = Path(sys.argv[1]), Path(sys.argv[2])
threads, runs, warmup = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
opts = ort.SessionOptions()
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
opts.intra_op_num_threads = threads
opts.inter_op_num_threads = 1
t0 = time.perf_counter()
sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
load_ms = (time.perf_counter() - t0) * 1e3
manifest = json.loads((inputs / "manifest.json").read_text())
feeds = {e["name"]: np.load(inputs / e["file"]) for e in manifest}
for _ in range(warmup):
    sess.run(None, feeds)
times = []
for _ in range(runs):
    t = time.perf_counter()
    sess.run(None, feeds)
    times.append((time.perf_counter() - t) * 1e3)
rss = 0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        rss = int(line.split()[1]) * 1024
times.sort()
print(json.dumps({"load_ms": load_ms, "median_ms": times[len(times) // 2],
                  "min_ms": times[0], "peak_rss_bytes": rss}))
"""


def ort_bench(python, case, threads, runs, warmup):
    model, inputs = case
    out = subprocess.run([python, "-c", ORT_CHILD, str(model), str(inputs), str(threads), str(runs), str(warmup)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def fused_elementwise_model(path):
    """y = gelu(x * a + b) + r over [4096, 4096] f32 (a, b per column): the fused-elementwise case of
    docs/performance.md (`cargo bench --bench fused_elementwise` runs the same graph from .kir)."""
    import onnx
    from onnx import TensorProto, helper

    n = 4096
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "a"], ["xa"]),
            helper.make_node("Add", ["xa", "b"], ["z"]),
            helper.make_node("Gelu", ["z"], ["g"]),
            helper.make_node("Add", ["g", "r"], ["y"]),
        ],
        "fused_gelu",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n]),
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [n]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [n]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, n]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    import numpy as np

    rng = np.random.default_rng(1)
    inputs = path.parent / "inputs"
    inputs.mkdir(exist_ok=True)
    manifest = []
    for name, shape in [("x", [n, n]), ("a", [n]), ("b", [n]), ("r", [n, n])]:
        np.save(inputs / f"{name}.npy", rng.uniform(-1, 1, shape).astype(np.float32))
        manifest.append({"name": name, "file": f"{name}.npy"})
    (inputs / "manifest.json").write_text(json.dumps(manifest))
    return path.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,resnet18,bert_small,gpt2_small")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of kiln and ONNX Runtime per case")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models-dir", default=os.environ.get("KILN_MODELS_DIR", str(ROOT.parent / "shared" / "models")))
    ap.add_argument("--kiln", default=str(ROOT / "target" / "release" / "kiln"))
    ap.add_argument("--corpus", default="",
                    help="also time these models of the public corpus (.cache/corpus, scripts/gen_corpus.py), each "
                         "input set a case: NAME[,NAME…] or `all`")
    ap.add_argument("--elementwise", action="store_true",
                    help="also time the fused elementwise graph y = gelu(x*a + b) + r over 16M f32")
    args = ap.parse_args()

    kiln = Path(args.kiln)
    if not kiln.exists():
        sys.exit(f"{kiln} not found: run `cargo build --release` first")
    models_dir = Path(args.models_dir)
    python = sys.executable
    rows = []
    cases = []
    if args.models:
        if not models_dir.is_dir():
            sys.exit(f"reference models not found at {models_dir} (set KILN_MODELS_DIR, or --models '')")
        cases += [(name, (models_dir / name / "model.onnx", models_dir / name / "inputs")) for name in args.models.split(",")]
    if args.corpus:
        corpus = ROOT / ".cache" / "corpus"
        names = sorted(p.name for p in corpus.iterdir() if (p / "model.onnx").is_file()) if args.corpus == "all" \
            else args.corpus.split(",")
        for name in names:
            for s in sorted((corpus / name / "sets").iterdir()):
                shape = json.loads((s / "inputs" / "manifest.json").read_text())[0]["shape"]
                cases.append((f"{name} {'x'.join(map(str, shape))}", (corpus / name / "model.onnx", s / "inputs")))
    if args.elementwise:
        d = fused_elementwise_model(ROOT / ".cache" / "bench" / "fused_gelu" / "model.onnx")
        cases.append(("fused_gelu_16M", (d / "model.onnx", d / "inputs")))
    for name, model_dir in cases:
        for threads in [int(t) for t in args.threads.split(",")]:
            k_med, o_med, k_all, o_all = [], [], [], []
            o_rss = 0
            for _ in range(args.rounds):
                k = kiln_bench(kiln, model_dir, threads, args.runs, args.warmup)
                o = ort_bench(python, model_dir, threads, args.runs, args.warmup)
                k_med.append(k["median_ms"])
                o_med.append(o["median_ms"])
                k_all.append(k)
                o_all.append(o)
                o_rss = max(o_rss, o["peak_rss_bytes"])
            km, om = statistics.median(k_med), statistics.median(o_med)
            rows.append({
                "model": name, "threads": threads, "kiln_ms": km, "ort_ms": om, "ratio": km / om,
                # Import to executable; binding the weights (prepare steps, packing) is timed apart: it is work
                # per weight byte, set beside ONNX Runtime's session creation.
                "compile_ms": statistics.median(x["compile_ms"] - x.get("prepare_ms", 0.0) for x in k_all),
                "prepare_ms": statistics.median(x.get("prepare_ms", 0.0) for x in k_all),
                "ort_load_ms": statistics.median(x["load_ms"] for x in o_all),
                "kiln_rss_mib": max(x["peak_rss_bytes"] for x in k_all) / 2**20, "ort_rss_mib": o_rss / 2**20,
            })
            r = rows[-1]
            print(f"{name:24} {threads}t  kiln {km:8.3f} ms  ort {om:8.3f} ms  ratio {r['ratio']:.2f}  "
                  f"compile {r['compile_ms']:.1f} ms + weights {r['prepare_ms']:.1f} ms (ort session {r['ort_load_ms']:.1f} ms)  rss {r['kiln_rss_mib']:.0f}/{r['ort_rss_mib']:.0f} MiB",
                  flush=True)
    print()
    print("| model | threads | kiln median (ms) | ORT median (ms) | kiln / ORT | kiln compile (ms) "
          "| kiln weights prepared / ORT session creation (ms) | peak RSS kiln / ORT (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['threads']} | {r['kiln_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.2f} | "
              f"{r['compile_ms']:.1f} | {r['prepare_ms']:.1f} / {r['ort_load_ms']:.1f} | "
              f"{r['kiln_rss_mib']:.0f} / {r['ort_rss_mib']:.0f} |")
    for threads in sorted({r["threads"] for r in rows}):
        ratios = [r for r in rows if r["threads"] == threads]
        geomean = math.exp(sum(math.log(r["ratio"]) for r in ratios) / len(ratios))
        worst = max(ratios, key=lambda r: r["ratio"])
        print(f"{threads} thread(s): geometric mean kiln/ORT {geomean:.2f} over {len(ratios)} case(s); worst "
              f"{worst['model']} at {worst['ratio']:.2f}")
    by = {(r["model"], r["threads"]): r for r in rows}
    for name, _ in cases:
        if (name, 1) in by and (name, 2) in by:
            print(f"{name}: 2 threads are {by[(name, 1)]['kiln_ms'] / by[(name, 2)]['kiln_ms']:.2f}x faster than 1 "
                  f"(kiln)")


if __name__ == "__main__":
    main()

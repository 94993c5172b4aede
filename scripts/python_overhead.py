#!/usr/bin/env python3
"""What calling a model from Python costs on top of running it, for kiln and for ONNX Runtime, side by side.

    .venv/bin/python scripts/python_overhead.py [--model ../shared/models/mlp/model.onnx] [--threads 1]
        [--runs 5000] [--rounds 5] [--kiln target/release/kiln]

kiln: the mean time of ``session.run`` from Python minus the mean of ``kiln bench`` (the same model, threads and
inputs, timed inside Rust). ONNX Runtime: the mean time of its ``session.run`` from Python minus the mean of its
own ``model_run`` events (ONNX Runtime's profiler, timed inside C++). Rounds alternate between the measurements
and each figure is the median over rounds (the machine is noisy). Needs the kiln package installed with
``pip install ./python`` (a release build) and a release ``kiln`` binary (``cargo build --release --bin kiln``).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np
import onnxruntime

import kiln

NUMPY = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def feeds_for(session, folder):
    manifest = os.path.join(folder, "inputs", "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            return {e["name"]: np.load(os.path.join(folder, "inputs", e["file"])) for e in json.load(f)}
    rng = np.random.default_rng(0)
    return {
        a.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in a.shape]).astype(NUMPY[a.type])
        for a in session.get_inputs()
    }


def python_mean_us(session, feeds, runs):
    for _ in range(max(10, runs // 20)):
        session.run(None, feeds)
    t = time.perf_counter_ns()
    for _ in range(runs):
        session.run(None, feeds)
    return (time.perf_counter_ns() - t) / runs / 1e3


def kiln_bench_mean_us(kiln_bin, model, inputs, threads, runs):
    args = [kiln_bin, "bench", model, "--threads", str(threads), "--runs", str(runs), "--warmup", str(runs // 20)]
    for name, path in inputs.items():
        args += ["-i", f"{name}={path}"]
    done = subprocess.run(args + ["--json", "-q"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["mean_ms"] * 1e3


def ort_means_us(model, feeds, threads, runs):
    """(Python mean, model_run mean) of one profiled ONNX Runtime session."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as d:
        options.profile_file_prefix = os.path.join(d, "ort")
        session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        python = python_mean_us(session, feeds, runs)
        profile = session.end_profiling()
        with open(profile) as f:
            events = json.load(f)
    runs_us = [e["dur"] for e in events if e.get("name") == "model_run"]
    # The timed runs are the last `runs` model_run events (warm-up runs come first).
    return python, statistics.fmean(runs_us[-runs:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="../shared/models/mlp/model.onnx")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kiln", default="target/release/kiln")
    args = parser.parse_args()
    folder = os.path.dirname(args.model)
    session = kiln.InferenceSession(args.model, threads=args.threads, fallback="deny")
    feeds = feeds_for(session, folder)
    with tempfile.TemporaryDirectory() as d:
        inputs = {}
        for name, value in feeds.items():
            inputs[name] = os.path.join(d, f"{name}.npy")
            np.save(inputs[name], value)
        rows = {"kiln_python": [], "kiln_bench": [], "ort_python": [], "ort_model_run": []}
        for _ in range(args.rounds):
            rows["kiln_python"].append(python_mean_us(session, feeds, args.runs))
            rows["kiln_bench"].append(kiln_bench_mean_us(args.kiln, args.model, inputs, args.threads, args.runs))
            python, native = ort_means_us(args.model, feeds, args.threads, args.runs)
            rows["ort_python"].append(python)
            rows["ort_model_run"].append(native)
    med = {k: statistics.median(v) for k, v in rows.items()}
    kiln_overhead = med["kiln_python"] - med["kiln_bench"]
    ort_overhead = med["ort_python"] - med["ort_model_run"]
    print(f"model {args.model}, {args.threads} thread(s), {args.runs} runs x {args.rounds} rounds (medians, µs/run)")
    print("| | from Python | inside the runtime | Python overhead |")
    print("| --- | --- | --- | --- |")
    print(f"| kiln | {med['kiln_python']:.1f} | {med['kiln_bench']:.1f} (kiln bench) | {kiln_overhead:.1f} |")
    print(f"| ONNX Runtime | {med['ort_python']:.1f} | {med['ort_model_run']:.1f} (model_run) | {ort_overhead:.1f} |")
    print(json.dumps({"median_us": med, "kiln_overhead_us": kiln_overhead, "ort_overhead_us": ort_overhead}))


if __name__ == "__main__":
    main()

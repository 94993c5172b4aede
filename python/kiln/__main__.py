"""``python -m kiln``: the CLI's ``run`` and ``bench`` through the Python package.

    python -m kiln run MODEL [-i NAME=FILE.npy ...] [--inputs DIR] [-o DIR] [--require-inputs]
    python -m kiln bench MODEL [--runs N] [--warmup N] [--json]

Both take ``--threads``, ``--backend``, ``--shape NAME=DxD`` and ``--fallback`` as ``kiln`` does. ``run`` writes
``<output>.npy`` files and a ``manifest.json`` (output name to file) into ``-o``; ``--inputs DIR`` reads a folder
with such a manifest. Inputs not given get pseudo-random values, said on stderr (``--require-inputs`` refuses).
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from . import InferenceSession, KilnError, load


def _shapes(specs):
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"--shape: expected NAME=DxD, got `{spec}`")
        try:
            shapes[name] = [int(d) for d in dims.split("x")] if dims else []
        except ValueError:
            raise SystemExit(f"--shape {name}: `{dims}` is not a list of extents like 1x3x224x224")
    return shapes


def _session(args):
    threads = args.threads
    if os.path.isdir(args.model) and os.path.exists(os.path.join(args.model, "manifest.json")):
        if args.shape:
            raise SystemExit("--shape: a compiled artifact's shapes were fixed when it was compiled")
        return load(args.model, threads=threads, fallback=args.fallback)
    return InferenceSession(
        args.model, threads=threads, backend=args.backend, shapes=_shapes(args.shape) or None, fallback=args.fallback
    )


def _read_npy(path, what):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{what}: {path}: {e}")


def _read_manifest(folder):
    """``{name: path}`` from a folder's manifest.json: a list of ``{"name", "file", ...}`` as ``kiln run`` writes
    (and the reference models' folders hold), or an object mapping names to files."""
    manifest = os.path.join(folder, "manifest.json")
    try:
        with open(manifest) as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--inputs: {manifest}: {e}")
    if isinstance(entries, dict):
        entries = [{"name": n, "file": f} for n, f in entries.items()]
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("file"), str) for e in entries
    ):
        raise SystemExit(f"--inputs: {manifest}: expected a list of {{\"name\", \"file\"}} entries")
    return {e["name"]: os.path.join(folder, e["file"]) for e in entries}


def _feeds(session, args):
    feeds = {}
    if getattr(args, "inputs", None):
        for name, path in _read_manifest(args.inputs).items():
            feeds[name] = _read_npy(path, f"--inputs {name}")
    for spec in getattr(args, "input", None) or []:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"--input: expected NAME=FILE.npy, got `{spec}`")
        if name in feeds:
            raise SystemExit(f"--input `{name}` is given twice")
        feeds[name] = _read_npy(path, f"--input {name}")
    names = [i.name for i in session.get_inputs()]
    unknown = [n for n in feeds if n not in names]
    if unknown:
        raise SystemExit(f"the model has no input `{unknown[0]}` (inputs: {', '.join(names)})")
    shapes = _shapes(args.shape)
    rng = np.random.default_rng(args.seed)
    missing = []
    for arg in session.get_inputs():
        if arg.name in feeds:
            continue
        missing.append(arg.name)
        dims = shapes.get(arg.name) or [d if isinstance(d, int) else 1 for d in arg.shape]
        dtype = _NUMPY[arg.type]
        if np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.uniform(-1, 1, dims).astype(dtype)
        elif dtype == np.bool_:
            feeds[arg.name] = rng.integers(0, 2, dims).astype(np.bool_)
        else:
            feeds[arg.name] = rng.integers(0, 10, dims).astype(dtype)
    if missing:
        if getattr(args, "require_inputs", False):
            raise SystemExit(f"inputs not given: {', '.join(missing)} (--require-inputs)")
        print(f"note: inputs not given, filled with pseudo-random values: {', '.join(missing)}", file=sys.stderr)
    return feeds


_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}


def _run(args):
    session = _session(args)
    feeds = _feeds(session, args)
    t = time.perf_counter()
    outputs = session.run(None, feeds)
    ms = (time.perf_counter() - t) * 1e3
    os.makedirs(args.output_dir, exist_ok=True)
    manifest = []
    print(f"model {args.model} ({session.backend} backend): ran in {ms:.1f} ms")
    for arg, value in zip(session.get_outputs(), outputs):
        # The file names and manifest of `kiln run`.
        file = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in arg.name) + ".npy"
        np.save(os.path.join(args.output_dir, file), value)
        manifest.append({"name": arg.name, "file": file, "dtype": str(value.dtype), "shape": list(value.shape)})
        print(f"  {arg.name}: {value.dtype}{list(value.shape)} -> {os.path.join(args.output_dir, file)}")
    with open(os.path.join(args.output_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


def _bench(args):
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    session = _session(args)
    feeds = _feeds(session, args)
    for _ in range(args.warmup):
        session.run(None, feeds)
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    summary = {
        "model": args.model,
        "backend": session.backend,
        "runs": args.runs,
        "mean_ms": statistics.fmean(times),
        "median_ms": statistics.median(times),
        "min_ms": min(times),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{args.model} ({session.backend}): median {summary['median_ms']:.3f} ms, mean {summary['mean_ms']:.3f} ms, "
            f"min {summary['min_ms']:.3f} ms over {args.runs} runs"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kiln", description="kiln's run and bench, from Python")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help in [("run", "run a model once and write its outputs"), ("bench", "time a model's runs")]:
        p = commands.add_parser(name, help=help)
        p.add_argument("model", help="an ONNX or .kir model, or an artifact directory of `kiln compile`")
        p.add_argument("--threads", type=int, default=None, help="worker threads (default: all cores)")
        p.add_argument("--backend", default=None, help="cpu (default), cuda or interp")
        p.add_argument("--shape", action="append", default=[], metavar="NAME=DxD", help="extents of a symbolic input")
        p.add_argument("--fallback", default="warn", choices=["warn", "allow", "deny"])
        p.add_argument("-i", "--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input value")
        p.add_argument("--inputs", metavar="DIR", help="a folder of .npy inputs with a manifest.json")
        p.add_argument("--require-inputs", action="store_true", help="refuse to fill inputs not given")
        p.add_argument("--seed", type=int, default=0, help="seed of pseudo-random inputs")
        if name == "run":
            p.add_argument("-o", "--output-dir", default="kiln-out", metavar="DIR")
        else:
            p.add_argument("--runs", type=int, default=100)
            p.add_argument("--warmup", type=int, default=10)
            p.add_argument("--json", action="store_true", help="one JSON object instead of the text line")
    args = parser.parse_args(argv)
    try:
        (_run if args.command == "run" else _bench)(args)
    except KilnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

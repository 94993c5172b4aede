#!/usr/bin/env python3
"""Compares a run's outputs with the expected ones: `gpu_compare.py EXPECTED_DIR ACTUAL_DIR [--name N] [--json F]`.

Both directories hold `<output>.npy` files and a `manifest.json` (a list of {"name", "file", ...} in output order,
as `kiln run` and the reference models' `expected/` write). Every expected output must be in ACTUAL_DIR with the
same shape; floats match with rtol 1e-3, atol 1e-4 (NaN matches NaN, infinities must be equal); integers and bools
exactly. Prints one line, `PASS NAME ...` or `FAIL NAME: why`, exits 0 or 1 and, with --json, writes the verdict.
`--run-log LOG` records a run that failed before writing outputs (the log's first `error` line says why).
Needs only numpy (scripts/gpu-check.sh runs it on the GPU machine).
"""

import argparse
import json
import os
import sys

import numpy as np

RTOL, ATOL = 1e-3, 1e-4


def load(path):
    a = np.load(path, allow_pickle=False)
    # bf16 arrives as 2-byte void records (numpy has no bf16): widen to f32 exactly.
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        a = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a


def files(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        return [(e["name"], e["file"]) for e in json.load(f)]


def compare_one(exp, got):
    """None when `got` matches `exp`, else why not."""
    if exp.shape != got.shape:
        return f"shape {list(got.shape)}, expected {list(exp.shape)}"
    if exp.dtype.kind == "f" or got.dtype.kind == "f":
        e, g = exp.astype(np.float64), got.astype(np.float64)
        ok = np.isclose(g, e, rtol=RTOL, atol=ATOL, equal_nan=True)
        bad = int(np.size(ok) - np.count_nonzero(ok))
        if bad:
            diff = np.abs(np.where(ok, 0.0, np.nan_to_num(g - e, nan=np.inf)))
            i = np.unravel_index(int(np.argmax(diff)), diff.shape)
            return f"{bad} of {exp.size} elements differ; worst at {list(map(int, i))}: {g[i]:.7g} vs {e[i]:.7g}"
        return None
    if exp.dtype != got.dtype:
        return f"dtype {got.dtype}, expected {exp.dtype}"
    neq = exp != got
    if np.any(neq):
        i = np.unravel_index(int(np.argmax(neq)), neq.shape)
        return f"{int(np.count_nonzero(neq))} of {exp.size} elements differ; first at {list(map(int, i))}: {got[i].item()} vs {exp[i].item()}"
    return None


def max_abs_diff(exp, got):
    if exp.shape != got.shape or exp.size == 0:
        return None
    with np.errstate(invalid="ignore"):  # inf - inf: a match, if both are; dropped below
        d = np.abs(exp.astype(np.float64) - got.astype(np.float64))
    d = d[np.isfinite(d)]
    return float(d.max()) if d.size else 0.0


def compare(expected_dir, actual_dir):
    """(ok, why or None, per-output details)."""
    got_files = dict(files(actual_dir))
    outputs, problems = [], []
    for name, file in files(expected_dir):
        if name not in got_files:
            problems.append(f"output `{name}` is missing")
            outputs.append({"name": name, "ok": False, "why": "missing"})
            continue
        exp = load(os.path.join(expected_dir, file))
        got = load(os.path.join(actual_dir, got_files[name]))
        why = compare_one(exp, got)
        outputs.append({"name": name, "ok": why is None, "why": why, "max_abs_diff": max_abs_diff(exp, got)})
        if why:
            problems.append(f"output `{name}`: {why}")
    return not problems, "; ".join(problems) or None, outputs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("expected")
    p.add_argument("actual")
    p.add_argument("--name", help="the case's name in the verdict (default: ACTUAL_DIR's name)")
    p.add_argument("--json", help="write the verdict here")
    p.add_argument("--run-log", help="the run failed: report the log's first error line")
    a = p.parse_args()
    name = a.name or os.path.basename(os.path.normpath(a.actual))
    if a.run_log:
        lines = open(a.run_log, errors="replace").read().splitlines() or ["(no output)"]
        why = "run failed: " + next((l for l in lines if "error" in l.lower()), lines[-1]).strip()
        ok, outputs = False, []
    else:
        try:
            ok, why, outputs = compare(a.expected, a.actual)
        except (OSError, ValueError, KeyError) as e:
            ok, why, outputs = False, f"cannot compare: {e}", []
    worst = max((o["max_abs_diff"] for o in outputs if o.get("max_abs_diff") is not None), default=None)
    if ok:
        print(f"PASS {name} ({len(outputs)} output(s), max |diff| {worst:.3g})" if worst is not None else f"PASS {name}")
    else:
        print(f"FAIL {name}: {why}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"name": name, "ok": ok, "why": why, "max_abs_diff": worst, "outputs": outputs}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

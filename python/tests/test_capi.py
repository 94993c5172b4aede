"""The C API (include/kiln.h, libkiln_c.so): the example in examples/c runs reference models and matches ONNX
Runtime; tests/c/api_misuse.c checks that misuse is an error code and never a crash, and runs one session from
several threads. The library comes from `cargo build -p kiln-capi` (KILN_CAPI_LIB_DIR, default target/debug)."""

import os
import shutil
import subprocess

import numpy as np
import onnxruntime
import pytest

from conftest import REPO, assert_close, reference_model, saved_inputs

LIB_DIR = os.environ.get("KILN_CAPI_LIB_DIR", str(REPO / "target" / "debug"))


@pytest.fixture(scope="session")
def c_program(tmp_path_factory):
    if not os.path.exists(os.path.join(LIB_DIR, "libkiln_c.so")):
        pytest.fail(f"libkiln_c.so is not in {LIB_DIR}: build it with `cargo build -p kiln-capi`")
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (cc) is needed to build the C API's example"
    out = tmp_path_factory.mktemp("c")

    def build(source):
        exe = out / os.path.splitext(os.path.basename(source))[0]
        subprocess.run(
            [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(REPO / "include"), str(REPO / source),
             "-L", LIB_DIR, "-lkiln_c", f"-Wl,-rpath,{LIB_DIR}", "-lpthread", "-o", str(exe)],
            check=True,
        )
        return str(exe)

    return build


@pytest.mark.parametrize("name", ["mlp", "bert_small"])
def test_c_example_matches_onnxruntime(c_program, tmp_path, name):
    folder = reference_model(name)
    feeds = saved_inputs(folder)
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    paths = []
    for arg in session.get_inputs():
        paths.append(str(tmp_path / f"{arg.name}.npy"))
        np.save(paths[-1], feeds[arg.name])
    exe = c_program("examples/c/run_model.c")
    done = subprocess.run([exe, str(folder / "model.onnx"), str(tmp_path), *paths], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    want = session.run(None, feeds)
    for i, (arg, w) in enumerate(zip(session.get_outputs(), want)):
        assert_close(np.load(tmp_path / f"{i}.npy"), w, f"{name}: {arg.name} through kiln.h")


def test_c_api_misuse_is_an_error_never_a_crash(c_program, tiny):
    exe = c_program("tests/c/api_misuse.c")
    done = subprocess.run([exe, str(tiny)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all C API checks passed" in done.stdout


def test_c_api_misuse_under_valgrind(c_program, tiny):
    valgrind = shutil.which("valgrind")
    if not valgrind:
        pytest.skip("valgrind is not installed (scripts/setup.sh installs it)")
    exe = c_program("tests/c/api_misuse.c")
    done = subprocess.run(
        [valgrind, "-q", "--error-exitcode=9", "--leak-check=full", "--errors-for-leak-kinds=definite", exe, str(tiny)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "all C API checks passed" in done.stdout

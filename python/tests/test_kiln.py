"""The kiln Python package against ONNX Runtime, in one process: the reference models, threads sharing a session,
zero-copy inputs and outputs, bad feeds, errors, artifacts, generation, the ONNX Runtime-style example and
``python -m kiln``."""

import json
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

from conftest import REPO, assert_close, reference_model, saved_inputs, tiny_feeds


@pytest.mark.parametrize("name", ["mlp", "mlp_dynbatch", "resnet18", "bert_small", "gpt2_small", "gpt2_small_step"])
def test_reference_models_match_onnxruntime(name):
    folder = reference_model(name)
    feeds = saved_inputs(folder)
    session = kiln.InferenceSession(str(folder / "model.onnx"), threads=1, fallback="deny")
    ort = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)
    want = ort.run(None, feeds)
    assert [o.name for o in session.get_outputs()] == [o.name for o in ort.get_outputs()]
    assert len(got) == len(want)
    for arg, g, w in zip(session.get_outputs(), got, want):
        assert_close(g, w, f"{name}: {arg.name}")


def test_metadata_has_onnxruntime_shape(tiny):
    session = kiln.InferenceSession(str(tiny))
    ort = onnxruntime.InferenceSession(str(tiny), providers=["CPUExecutionProvider"])
    for ours, theirs in [(session.get_inputs(), ort.get_inputs()), (session.get_outputs(), ort.get_outputs())]:
        assert [(a.name, a.shape, a.type) for a in ours] == [(a.name, a.shape, a.type) for a in theirs]
    assert session.get_inputs()[0].shape == ["batch", 8]
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.backend == "cpu"
    assert session.fallbacks == []


def test_sources_bytes_and_pathlike(tiny):
    feeds = tiny_feeds()
    want = onnxruntime.InferenceSession(str(tiny), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for source in [str(tiny), tiny, tiny.read_bytes()]:
        (got,) = kiln.InferenceSession(source).run(None, feeds)
        assert_close(got, want, f"from {type(source).__name__}")


def test_output_names_select_and_order(tiny):
    session = kiln.InferenceSession(str(tiny))
    feeds = tiny_feeds()
    (y,) = session.run(["y"], feeds)
    (all_y,) = session.run(None, feeds)
    np.testing.assert_array_equal(y, all_y)
    with pytest.raises(kiln.InvalidInput, match=r"no output `nope` \(outputs: `y`\)"):
        session.run(["nope"], feeds)


def test_symbolic_batch_runs_at_any_size(tiny):
    session = kiln.InferenceSession(str(tiny))
    ort = onnxruntime.InferenceSession(str(tiny), providers=["CPUExecutionProvider"])
    for batch in [1, 5, 64]:
        feeds = tiny_feeds(batch, seed=batch)
        assert_close(session.run(None, feeds)[0], ort.run(None, feeds)[0], f"batch {batch}")


def test_threads_share_one_session(tiny):
    session = kiln.InferenceSession(str(tiny), threads=1)
    ort = onnxruntime.InferenceSession(str(tiny), providers=["CPUExecutionProvider"])
    cases = [tiny_feeds(batch=1 + i % 7, seed=i) for i in range(16)]
    wants = [ort.run(None, f)[0] for f in cases]
    errors = []

    def work(k):
        try:
            for round in range(25):
                i = (k + round) % len(cases)
                np.testing.assert_allclose(session.run(None, cases[i])[0], wants[i], rtol=1e-5, atol=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_inputs_are_read_without_a_copy(tiny):
    session = kiln.InferenceSession(str(tiny))
    feeds = tiny_feeds(batch=4)
    (y,) = session.run(None, feeds)
    bound = session._bound_addresses()
    assert bound == {name: a.ctypes.data for name, a in feeds.items()}
    # A strided view is copied into a contiguous array first: another address, the same answer.
    wide = np.zeros([4, 16], np.float32)
    wide[:, ::2] = feeds["x"]
    strided = wide[:, ::2]
    assert not strided.flags["C_CONTIGUOUS"]
    (y2,) = session.run(None, {"x": strided, "scale": feeds["scale"]})
    assert session._bound_addresses()["x"] != strided.ctypes.data
    np.testing.assert_array_equal(y, y2)
    # So is a Fortran-ordered one, and a big-endian one is brought to native order.
    (y3,) = session.run(None, {"x": np.asfortranarray(feeds["x"]), "scale": feeds["scale"]})
    (y4,) = session.run(None, {"x": feeds["x"].astype(">f4"), "scale": feeds["scale"]})
    np.testing.assert_array_equal(y, y3)
    np.testing.assert_array_equal(y, y4)


def test_outputs_are_handed_over_without_a_copy(tiny):
    (y,) = kiln.InferenceSession(str(tiny)).run(None, tiny_feeds())
    # The array views memory owned by a non-NumPy object (kiln's output buffer), not a NumPy copy.
    owner = y
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    assert not isinstance(owner, np.ndarray), "the output was copied into a NumPy-owned buffer"
    assert y.flags["C_CONTIGUOUS"] and y.flags["WRITEABLE"]


BAD_FEEDS = [
    ("unknown name", lambda f: {**f, "nope": f["x"]}, r"no input `nope` \(inputs: `x`, `scale`\)"),
    ("missing input", lambda f: {"x": f["x"]}, r"input `scale` is missing"),
    ("wrong dtype", lambda f: {**f, "x": f["x"].astype(np.float64)}, r"input `x` must be float32.*got float64"),
    ("wrong rank", lambda f: {**f, "x": f["x"].reshape(-1)}, r"input `x` should have shape"),
    ("wrong static dim", lambda f: {**f, "x": np.zeros([3, 9], np.float32)}, r"input `x` should have shape"),
    ("object array", lambda f: {**f, "x": np.array([[object()] * 8], dtype=object)}, r"dtype object"),
    ("strings", lambda f: {**f, "x": np.array([["a"] * 8])}, r"input `x` has dtype <U1"),
    ("complex64", lambda f: {**f, "x": f["x"].astype(np.complex64)}, r"dtype complex64, which kiln does not take"),
    ("int16 for float32", lambda f: {**f, "x": f["x"].astype(np.int16)}, r"input `x` must be float32.*got int16"),
]


@pytest.mark.parametrize("case", BAD_FEEDS, ids=[c[0] for c in BAD_FEEDS])
def test_bad_feeds_raise_and_leave_the_session_usable(tiny, case):
    _, make, message = case
    session = kiln.InferenceSession(str(tiny))
    feeds = tiny_feeds()
    (want,) = session.run(None, feeds)
    with pytest.raises(kiln.InvalidInput, match=message):
        session.run(None, make(feeds))
    np.testing.assert_array_equal(session.run(None, feeds)[0], want)


def test_feeds_must_be_a_dict(tiny):
    session = kiln.InferenceSession(str(tiny))
    with pytest.raises(TypeError):
        session.run(None, [tiny_feeds()["x"]])
    with pytest.raises(kiln.InvalidInput, match="input names are strings"):
        session.run(None, {0: tiny_feeds()["x"]})


def test_lists_are_converted_like_numpy_does(tiny):
    session = kiln.InferenceSession(str(tiny))
    feeds = tiny_feeds(batch=1)
    (want,) = session.run(None, feeds)
    (got,) = session.run(None, {"x": feeds["x"], "scale": [np.float32(0.5)]})
    np.testing.assert_array_equal(got, want)


def test_model_errors_are_exceptions_of_their_kind(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(kiln.InvalidModel) as e:
        kiln.InferenceSession(str(missing))
    assert str(e.value).count("nope.onnx") == 1, str(e.value)
    with pytest.raises(kiln.InvalidModel, match="not a valid ONNX model"):
        kiln.InferenceSession(b"\x08\x07garbage that is not a protobuf")
    with pytest.raises(TypeError):
        kiln.InferenceSession(42)
    assert issubclass(kiln.InvalidModel, kiln.KilnError) and issubclass(kiln.KilnError, Exception)


def unsupported_model(path):
    node = helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="com.example")
    graph = helper.make_graph(
        [node],
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    onnx.save(model, path)
    return path


def test_unsupported_models_are_listed_and_raise(tmp_path):
    path = unsupported_model(tmp_path / "fancy.onnx")
    problems = kiln.check(str(path))
    assert len(problems) == 1 and problems[0][0] == "com.example.FancyOp" and problems[0][1] == "fancy", problems
    with pytest.raises(kiln.Unsupported, match="FancyOp"):
        kiln.InferenceSession(str(path))
    assert "MatMul" in kiln.supported_ops() and "com.microsoft.QGemm" in kiln.supported_ops()


def fallback_model(path):
    """A ScatterElements: kiln compiles the rest and runs that node on its reference interpreter."""
    graph = helper.make_graph(
        [helper.make_node("ScatterElements", ["x", "at", "add"], ["y"], name="scatter", axis=0, reduction="add")],
        "scatter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])],
        [
            numpy_helper.from_array(np.zeros((1, 1, 2, 2), np.int64), "at"),
            numpy_helper.from_array(np.array([[[[0.5, 1.5], [2.5, 3.5]]]], np.float32), "add"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_fallbacks_warn_or_are_denied(tmp_path):
    path = fallback_model(tmp_path / "scatter.onnx")
    with pytest.warns(kiln.FallbackWarning, match="scatter"):
        session = kiln.InferenceSession(str(path))
    assert [f[0] for f in session.fallbacks] == ["scatter"]
    feeds = {"x": np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)}
    (y,) = session.run(None, feeds)
    (want,) = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.InferenceSession(str(path), fallback="allow")
    with pytest.raises(kiln.Unsupported, match="fallback policy `deny`"):
        kiln.InferenceSession(str(path), fallback="deny")
    with pytest.raises(ValueError, match="not a fallback policy"):
        kiln.InferenceSession(str(path), fallback="sometimes")


def test_top_k_is_compiled(tmp_path):
    """TopK (a library routine, not the interpreter) under fallback="deny", with ONNX Runtime's answer."""
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], name="topk")],
        "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, [3, 2]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [3, 2]),
        ],
        [numpy_helper.from_array(np.array([2], np.int64), "k")],
    )
    path = tmp_path / "topk.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    session = kiln.InferenceSession(str(path), fallback="deny")
    feeds = {"x": np.random.default_rng(3).standard_normal([3, 6]).astype(np.float32)}
    want = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, w in zip(session.run(None, feeds), want):
        np.testing.assert_array_equal(got, w)


def test_every_dtype_crosses_the_boundary(tmp_path):
    """16-bit integers, bfloat16 and the narrow types (float8 via ml_dtypes, int4) go in and come out as numpy
    arrays of the same dtype, and a float8 cast matches ONNX's reference bit for bit."""
    import ml_dtypes
    from onnx.reference import ReferenceEvaluator

    types = [
        ("u16", TensorProto.UINT16, np.uint16),
        ("i16", TensorProto.INT16, np.int16),
        ("bf16", TensorProto.BFLOAT16, ml_dtypes.bfloat16),
        ("e4m3", TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn),
        ("e5m2", TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2),
        ("i4", TensorProto.INT4, ml_dtypes.int4),
    ]
    nodes = [helper.make_node("Identity", [f"{n}_in"], [f"{n}_out"]) for n, _, _ in types]
    nodes.append(helper.make_node("Cast", ["x"], ["x8"], to=TensorProto.FLOAT8E4M3FN))
    inputs = [helper.make_tensor_value_info(f"{n}_in", t, [5]) for n, t, _ in types]
    outputs = [helper.make_tensor_value_info(f"{n}_out", t, [5]) for n, t, _ in types]
    graph = helper.make_graph(
        nodes,
        "dtypes",
        inputs + [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
        outputs + [helper.make_tensor_value_info("x8", TensorProto.FLOAT8E4M3FN, [5])],
    )
    path = tmp_path / "dtypes.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    values = np.array([-3.0, -0.5, 0.0, 1.0, 7.0], np.float32)
    feeds = {f"{n}_in": values.astype(np.int64).astype(d) if n in ("u16", "i16", "i4") else values.astype(d)
             for n, _, d in types}
    feeds["u16_in"] = np.array([0, 1, 300, 40000, 65535], np.uint16)
    feeds["x"] = np.array([0.1, -2.7, 500.0, 1e-3, -448.0], np.float32)
    # The float8 cast is computed on the interpreter, and says so.
    with pytest.warns(kiln.FallbackWarning, match="f8e4m3fn"):
        session = kiln.InferenceSession(str(path))
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))

    def bits(a):
        return a.view(f"u{a.dtype.itemsize}")

    for n, _, d in types:
        assert got[f"{n}_out"].dtype == np.dtype(d), n
        np.testing.assert_array_equal(bits(got[f"{n}_out"]), bits(feeds[f"{n}_in"]), err_msg=n)
    (want,) = ReferenceEvaluator(str(path)).run(["x8"], feeds)
    assert got["x8"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(got["x8"].view(np.uint8), np.asarray(want).view(np.uint8))


def test_onnxruntime_options_and_providers(tiny):
    options = kiln.SessionOptions()
    options.intra_op_num_threads = 2
    session = kiln.InferenceSession(str(tiny), options, ["CPUExecutionProvider"])
    assert session.backend == "cpu"
    with pytest.warns(UserWarning, match="no providers"):
        kiln.InferenceSession(str(tiny), providers=["TensorrtExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(kiln.Unsupported, match="none of the providers"):
        kiln.InferenceSession(str(tiny), providers=["TensorrtExecutionProvider"])
    # A CUDA provider without a device gives way to the next (with a warning), as in ONNX Runtime.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = kiln.InferenceSession(str(tiny), providers=[("CUDAExecutionProvider", {}), "CPUExecutionProvider"])
    assert session.backend in ("cuda", "cpu")
    interp = kiln.InferenceSession(str(tiny), backend="interp")
    np.testing.assert_allclose(interp.run(None, tiny_feeds())[0], session.run(None, tiny_feeds())[0], rtol=1e-5)
    with pytest.raises(kiln.Unsupported, match="unknown backend"):
        kiln.InferenceSession(str(tiny), backend="tpu")


def test_shapes_specialize_symbolic_inputs(tiny):
    session = kiln.InferenceSession(str(tiny), shapes={"x": [2, 8]})
    assert session.get_inputs()[0].shape == [2, 8]
    with pytest.raises(kiln.InvalidInput):
        session.run(None, tiny_feeds(batch=3))


def test_compile_then_load_runs_without_the_compiler(tiny, tmp_path):
    out = kiln.compile(str(tiny), str(tmp_path / "art"))
    assert (Path(out) / "manifest.json").exists()
    feeds = tiny_feeds(batch=5)
    want = kiln.InferenceSession(str(tiny)).run(None, feeds)[0]
    for session in [kiln.load(out), kiln.InferenceSession(out)]:
        np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-6)
        assert [a.name for a in session.get_inputs()] == ["x", "scale"]
    with pytest.raises(kiln.InvalidModel, match="not an artifact directory"):
        kiln.load(str(tmp_path))
    with pytest.raises(kiln.Unsupported, match="not a compile target"):
        kiln.compile(str(tiny), str(tmp_path / "interp"), target="interp")


def test_generate_reuses_prefixes_and_states():
    folder = reference_model("gpt2_small_step")
    session = kiln.InferenceSession(str(folder / "model.onnx"), threads=1)
    prompt = [5, 17, 301, 42, 9, 77, 1000, 3]
    first = session.generate(prompt, 4)
    assert len(first.ids) == 4 and first.logits.shape == (4, 4096) and first.reused_prefix_len == 0
    again = session.generate(prompt + first.ids[:2] + [11], 2)
    assert again.used_cached_state and again.reused_prefix_len > 0 and again.tokens_saved > 0
    assert again.cache_entries >= 1
    # The exported state resumes in a fresh session exactly as the cache does.
    fresh = kiln.InferenceSession(str(folder / "model.onnx"), threads=1)
    resumed = fresh.generate(prompt + first.ids[:3], 1, state=first.state)
    cached = session.generate(prompt + first.ids[:3], 1)
    assert resumed.ids == cached.ids and resumed.reused_prefix_len > 0
    with pytest.raises(kiln.ExecutionError, match="state"):
        fresh.generate(prompt, 1, state=b"not a state")


def test_onnxruntime_style_example_runs_unchanged(tmp_path):
    folder = reference_model("mlp_dynbatch")
    example = REPO / "examples" / "python" / "ort_style.py"
    text = example.read_text()
    assert "import kiln as ort\n" in text
    original = tmp_path / "ort_original.py"
    original.write_text(text.replace("import kiln as ort\n", "import onnxruntime as ort\n"))
    # The script is ONNX Runtime's: the import line is the only difference.
    diff = [(a, b) for a, b in zip(text.splitlines(), original.read_text().splitlines()) if a != b]
    assert diff == [("import kiln as ort", "import onnxruntime as ort")]
    runs = []
    for script in [example, original]:
        done = subprocess.run(
            [sys.executable, str(script), str(folder / "model.onnx"), "--batch", "3"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.splitlines())
    ours, theirs = runs
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs):
        if a.startswith("row"):
            top_a, p_a = a.split(" p=")
            top_b, p_b = b.split(" p=")
            assert top_a == top_b
            np.testing.assert_allclose(json.loads(p_a), json.loads(p_b), atol=2e-4)
        else:
            assert a == b


def run_module(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_python_m_kiln_run_and_bench(tiny, tmp_path):
    done = run_module("run", str(tiny), "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "inputs not given, filled with pseudo-random values: x, scale" in done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest == [{"name": "y", "file": "y.npy", "dtype": "float32", "shape": [1, 4]}]
    # Outputs of one run are inputs of the next through the same manifest format.
    inputs = tmp_path / "in"
    inputs.mkdir()
    feeds = tiny_feeds(batch=2)
    for name, value in feeds.items():
        np.save(inputs / f"{name}.npy", value)
    (inputs / "manifest.json").write_text(json.dumps([{"name": n, "file": f"{n}.npy"} for n in feeds]))
    done = run_module("run", str(tiny), "--inputs", "in", "--require-inputs", "-o", "out2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pseudo-random" not in done.stderr
    want = onnxruntime.InferenceSession(str(tiny), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert_close(np.load(tmp_path / "out2" / "y.npy"), want, "python -m kiln run")
    done = run_module("run", str(tiny), "--require-inputs", cwd=tmp_path)
    assert done.returncode != 0 and "inputs not given: x, scale (--require-inputs)" in done.stderr
    done = run_module("run", str(tiny), "-i", "nope=in/x.npy", cwd=tmp_path)
    assert done.returncode != 0 and "no input `nope` (inputs: x, scale)" in done.stderr
    done = run_module("bench", str(tiny), "--runs", "5", "--warmup", "1", "--json", "--threads", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["runs"] == 5 and summary["backend"] == "cpu" and summary["median_ms"] > 0
    done = run_module("run", str(tmp_path / "missing.onnx"), cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("error: ") and "missing.onnx" in done.stderr

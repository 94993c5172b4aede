//! `kiln._kiln`: the extension module behind the `kiln` Python package (PyO3, stable ABI).
//!
//! [`InferenceSession`] has ONNX Runtime's shape: `get_inputs()`, `get_outputs()`, `run(names, feeds)`. A run
//! binds each C-contiguous, aligned NumPy input of the model's dtype where it lies (a [`kiln_ir::TensorView`]:
//! no copy), releases the GIL while the program runs, and hands each output's storage to NumPy without a copy.
//! One session serves any number of Python threads at once. `docs/python.md` is the user's guide.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Mutex;

use kiln::generate::{GenerateOptions, Generator};
use kiln::{
    Backend, BackendRegistry, CompileOptions, ErrorKind, FallbackPolicy, LoadOptions, Model, Session, SessionOptions,
};
use kiln_ir::{DType, Data, Dim, Tensor, TensorType, TensorView};
use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyUserWarning};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

create_exception!(kiln, KilnError, PyException, "Every error kiln raises derives from this class.");
create_exception!(kiln, InvalidModel, KilnError, "The model, weights or artifact could not be read or is malformed.");
create_exception!(
    kiln,
    Unsupported,
    KilnError,
    "The model is valid but uses an op, attribute, dtype or backend kiln does not support (or fallbacks were denied)."
);
create_exception!(kiln, InvalidInput, KilnError, "The feeds do not fit the model: a name, dtype, shape or value.");
create_exception!(kiln, ExecutionError, KilnError, "Running the model failed.");
create_exception!(
    kiln,
    FallbackWarning,
    PyUserWarning,
    "Nodes of the model run on kiln's reference interpreter (correct, slow)."
);

/// A kiln error as the Python exception of its kind, carrying kiln's message.
fn py_err(e: kiln::Error) -> PyErr {
    let message = e.to_string();
    match e.kind() {
        ErrorKind::Io | ErrorKind::InvalidModel => InvalidModel::new_err(message),
        ErrorKind::Unsupported => Unsupported::new_err(message),
        ErrorKind::InvalidInput => InvalidInput::new_err(message),
        ErrorKind::Runtime => ExecutionError::new_err(message),
    }
}

fn invalid_input(message: impl Into<String>) -> PyErr {
    InvalidInput::new_err(message.into())
}

/// ONNX Runtime's name of a tensor type (`tensor(float)`).
fn onnx_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "tensor(float)",
        DType::F16 => "tensor(float16)",
        DType::BF16 => "tensor(bfloat16)",
        DType::F64 => "tensor(double)",
        DType::I8 => "tensor(int8)",
        DType::U8 => "tensor(uint8)",
        DType::I32 => "tensor(int32)",
        DType::I64 => "tensor(int64)",
        DType::Bool => "tensor(bool)",
        DType::I16 => "tensor(int16)",
        DType::U16 => "tensor(uint16)",
        DType::U32 => "tensor(uint32)",
        DType::U64 => "tensor(uint64)",
        DType::F8E4M3FN => "tensor(float8e4m3fn)",
        DType::F8E4M3FNUZ => "tensor(float8e4m3fnuz)",
        DType::F8E5M2 => "tensor(float8e5m2)",
        DType::F8E5M2FNUZ => "tensor(float8e5m2fnuz)",
        DType::F8E8M0 => "tensor(float8e8m0)",
        DType::F4E2M1 => "tensor(float4e2m1)",
        DType::I4 => "tensor(int4)",
        DType::U4 => "tensor(uint4)",
        DType::I2 => "tensor(int2)",
        DType::U2 => "tensor(uint2)",
    }
}

/// NumPy's name of a dtype, for messages.
fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::F8E4M3FN => "float8_e4m3fn",
        DType::F8E4M3FNUZ => "float8_e4m3fnuz",
        DType::F8E5M2 => "float8_e5m2",
        DType::F8E5M2FNUZ => "float8_e5m2fnuz",
        DType::F8E8M0 => "float8_e8m0fnu",
        DType::F4E2M1 => "float4_e2m1fn",
        DType::I4 => "int4",
        DType::U4 => "uint4",
        DType::I2 => "int2",
        DType::U2 => "uint2",
    }
}

/// A model input or output as ONNX Runtime describes it.
#[pyclass(frozen, module = "kiln")]
struct NodeArg {
    /// The name.
    #[pyo3(get)]
    name: String,
    /// The extents: an int for a static dim, the dim's name (a string) for a symbolic one.
    #[pyo3(get)]
    shape: Py<PyList>,
    /// The tensor type, as ONNX Runtime spells it (`tensor(float)`).
    #[pyo3(get, name = "type")]
    ty: &'static str,
}

#[pymethods]
impl NodeArg {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let shape = self.shape.bind(py).repr()?;
        Ok(format!("NodeArg(name='{}', type='{}', shape={})", self.name, self.ty, shape))
    }
}

fn node_arg(py: Python<'_>, name: &str, ty: &TensorType) -> PyResult<NodeArg> {
    let shape = PyList::empty(py);
    for d in &ty.shape.0 {
        match d {
            Dim::Static(n) => shape.append(*n)?,
            Dim::Sym(s) => shape.append(s.as_str())?,
        }
    }
    Ok(NodeArg { name: name.to_string(), shape: shape.unbind(), ty: onnx_type(ty.dtype) })
}

/// A loaded model, ready to run from any number of threads.
#[pyclass(frozen, module = "kiln")]
struct InferenceSession {
    session: Session,
    /// The model file, for `generate` (which compiles step programs of its own).
    source: Option<PathBuf>,
    threads: usize,
    generator: Mutex<Option<Generator>>,
    /// The addresses the last run bound its inputs at (for the zero-copy tests).
    bound: Mutex<Vec<(String, usize)>>,
}

/// The backend a session asked for, and whether others may be tried after it (ONNX Runtime's provider list).
fn backends_from(
    py: Python<'_>,
    backend: Option<&str>,
    providers: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<Backend>> {
    if let Some(b) = backend {
        let b: Backend = b.parse().map_err(|e: String| Unsupported::new_err(e))?;
        return Ok(vec![b]);
    }
    let Some(providers) = providers.filter(|p| !p.is_none()) else { return Ok(vec![Backend::Cpu]) };
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    for p in providers.try_iter()? {
        let p = p?;
        // A provider is a name or a (name, options) pair.
        let name: String = match p.cast::<PyTuple>() {
            Ok(t) => t.get_item(0)?.extract()?,
            Err(_) => p.extract()?,
        };
        match name.as_str() {
            "CPUExecutionProvider" => out.push(Backend::Cpu),
            "CUDAExecutionProvider" => out.push(Backend::Cuda),
            _ => unknown.push(name),
        }
    }
    if out.is_empty() {
        return Err(Unsupported::new_err(format!(
            "none of the providers {unknown:?} is one kiln has (CPUExecutionProvider, CUDAExecutionProvider)"
        )));
    }
    if !unknown.is_empty() {
        warn(&py.get_type::<PyUserWarning>(), &format!("kiln has no providers {unknown:?}; using the ones it has"))?;
    }
    Ok(out)
}

/// Issues a Python warning of `category`.
fn warn(category: &Bound<'_, pyo3::types::PyType>, message: &str) -> PyResult<()> {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    PyErr::warn(category.py(), category, &text, 1)
}

fn fallback_policy(s: &str) -> PyResult<FallbackPolicy> {
    s.parse().map_err(|e: String| pyo3::exceptions::PyValueError::new_err(e))
}

/// The fallback warnings of a program under `policy` (the lines `kiln run` prints).
fn warn_fallbacks(py: Python<'_>, fallbacks: &[kiln::Fallback], policy: FallbackPolicy) -> PyResult<()> {
    if policy == FallbackPolicy::Warn {
        for (op, n, why) in kiln::fallback_kinds(fallbacks) {
            let message = format!("kiln: {n} `{op}` node(s) run on the reference interpreter: {why}");
            warn(&py.get_type::<FallbackWarning>(), &message)?;
        }
    }
    Ok(())
}

/// The worker threads of `threads=`, or of an ONNX Runtime-style options object's `intra_op_num_threads`.
fn thread_count(threads: Option<usize>, sess_options: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    if let Some(t) = threads {
        return Ok(t);
    }
    if let Some(o) = sess_options.filter(|o| !o.is_none())
        && let Ok(n) = o.getattr("intra_op_num_threads")
    {
        return n.extract::<usize>();
    }
    Ok(0)
}

impl InferenceSession {
    fn new_from(
        py: Python<'_>,
        session: Session,
        policy: FallbackPolicy,
        source: Option<PathBuf>,
        threads: usize,
    ) -> PyResult<InferenceSession> {
        warn_fallbacks(py, session.fallbacks(), policy)?;
        Ok(InferenceSession { session, source, threads, generator: Mutex::new(None), bound: Mutex::new(Vec::new()) })
    }
}

/// A feed's array, made C-contiguous, aligned and in native byte order (copied only when it is not already).
fn feed_array<'py>(
    np: &Bound<'py, PyModule>,
    name: &str,
    value: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyUntypedArray>, DType)> {
    let mut array = match value.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => np
            .call_method1("asarray", (value,))
            .and_then(|a| Ok(a.cast_into::<PyUntypedArray>()?))
            .map_err(|e| invalid_input(format!("input `{name}`: not an array ({e})")))?,
    };
    let descr = array.dtype();
    let dtype = match (descr.kind(), descr.itemsize()) {
        (b'f', 4) => DType::F32,
        (b'f', 2) => DType::F16,
        (b'f', 8) => DType::F64,
        (b'i', 1) => DType::I8,
        (b'u', 1) => DType::U8,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'i', 2) => DType::I16,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'b', 1) => DType::Bool,
        (b'V', 2) if descr.str()?.to_cow()? == "bfloat16" => DType::BF16,
        // ml_dtypes' one-byte types: most have kind `V`, float8_e5m2 has kind `f`.
        (b'V' | b'f', 1) => {
            let type_name = descr.str()?.to_cow()?.into_owned();
            DType::ALL.into_iter().find(|&d| d.is_narrow() && numpy_name(d) == type_name).ok_or_else(|| {
                invalid_input(format!("input `{name}` has dtype {type_name}, which kiln does not take"))
            })?
        }
        _ => {
            return Err(invalid_input(format!(
                "input `{name}` has dtype {}, which kiln does not take (float32, float16, bfloat16, float64, int8, \
                 uint8, int16, uint16, int32, uint32, int64, uint64, bool, and ml_dtypes' float8/float4/int4/int2)",
                descr.str()?
            )));
        }
    };
    if descr.byteorder() == b'>' {
        let native = descr.call_method1("newbyteorder", ("=",))?;
        array = array.call_method1("astype", (native,))?.cast_into::<PyUntypedArray>()?;
    }
    if !array.is_c_contiguous() || !array.is_aligned() {
        array = np.call_method1("ascontiguousarray", (&array,))?.cast_into::<PyUntypedArray>()?;
    }
    Ok((array, dtype))
}

/// The bytes of a C-contiguous, aligned array.
fn array_bytes<'a>(array: &'a Bound<'_, PyUntypedArray>, dtype: DType) -> &'a [u8] {
    let len = array.shape().iter().product::<usize>() * dtype.size_bytes();
    if len == 0 {
        return &[];
    }
    // SAFETY: `feed_array` made the array C-contiguous and aligned, so its `len` bytes start at `data`; the
    // array object (and with it the buffer, which it owns or keeps alive through its base) outlives the borrow
    // of `array`.
    unsafe { std::slice::from_raw_parts((*array.as_array_ptr()).fields.data.cast::<u8>(), len) }
}

/// An output tensor as a NumPy array that owns the tensor's storage (no copy).
fn to_numpy(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
    let (shape, data) = t.into_parts();
    Ok(match data {
        Data::F32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::F16(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::BF16(v) => {
            // NumPy has no bfloat16 of its own: ml_dtypes' is the one every framework shares.
            py.import("ml_dtypes").map_err(|_| {
                ExecutionError::new_err("a bfloat16 output needs the `ml_dtypes` package (pip install ml_dtypes)")
            })?;
            PyArray1::from_vec(py, v).reshape(shape)?.into_any()
        }
        Data::F64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::I8(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::U8(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::I32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::I64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::Bool(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::I16(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::U16(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::U32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::U64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        // One byte per element, as ml_dtypes lays its float8/float4/int4/int2 arrays out: the bytes, viewed.
        narrow => {
            let name = numpy_name(narrow.dtype());
            let ml = py.import("ml_dtypes").map_err(|_| {
                ExecutionError::new_err(format!(
                    "a {name} output needs the `ml_dtypes` package (pip install ml_dtypes)"
                ))
            })?;
            let bytes = PyArray1::from_vec(py, narrow.to_le_bytes()).reshape(shape)?;
            bytes.call_method1("view", (ml.getattr(name)?,))?
        }
    })
}

/// Shapes of `shapes=`: input name to extents.
fn shape_map(shapes: Option<BTreeMap<String, Vec<usize>>>) -> BTreeMap<String, Vec<usize>> {
    shapes.unwrap_or_default()
}

#[pymethods]
impl InferenceSession {
    /// Loads and compiles a model: an ONNX file (a path, or the model's bytes), a `.kir` file, or an artifact
    /// directory of `kiln compile`.
    ///
    /// `sess_options`, `providers` and `provider_options` are ONNX Runtime's: the options' `intra_op_num_threads`
    /// sets the threads, and the first provider kiln has (`CPUExecutionProvider`, `CUDAExecutionProvider`; a CUDA
    /// provider without a device gives way to the next) picks the backend. kiln's own: `threads` (0 or None: all
    /// cores), `backend` (`cpu`, `cuda`, `interp`), `shapes` (static extents for inputs with symbolic dims,
    /// `{name: [dims]}`), `fallback` (`warn`, `allow` or `deny` nodes that run on the reference interpreter).
    #[new]
    #[pyo3(signature = (path_or_bytes, sess_options=None, providers=None, provider_options=None, *, threads=None,
                        backend=None, shapes=None, fallback="warn"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path_or_bytes: &Bound<'_, PyAny>,
        sess_options: Option<&Bound<'_, PyAny>>,
        providers: Option<&Bound<'_, PyAny>>,
        provider_options: Option<&Bound<'_, PyAny>>,
        threads: Option<usize>,
        backend: Option<&str>,
        shapes: Option<BTreeMap<String, Vec<usize>>>,
        fallback: &str,
    ) -> PyResult<InferenceSession> {
        let _ = provider_options;
        let policy = fallback_policy(fallback)?;
        let threads = thread_count(threads, sess_options)?;
        kiln::resolve_threads(threads).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let candidates = backends_from(py, backend, providers)?;
        let load = LoadOptions { shapes: shape_map(shapes), ..Default::default() };
        let mut options = SessionOptions { threads, fallback: policy, ..Default::default() };
        let (model, source) = if let Ok(bytes) = path_or_bytes.cast::<PyBytes>() {
            let bytes = bytes.as_bytes();
            (py.detach(|| Model::from_onnx_bytes(bytes, "<bytes>", &load)).map_err(py_err)?, None)
        } else {
            let path: PathBuf = path_or_bytes.extract().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err("path_or_bytes: expected a path (str or os.PathLike) or bytes")
            })?;
            if kiln::Artifact::is_artifact(&path) {
                options.shapes = load.shapes;
                let session = py.detach(|| Session::open(&path, &options)).map_err(py_err)?;
                return InferenceSession::new_from(py, session, policy, None, threads);
            }
            (py.detach(|| Model::load(&path, &load)).map_err(py_err)?, Some(path))
        };
        let mut last = None;
        for (i, &backend) in candidates.iter().enumerate() {
            options.backend = backend;
            match py.detach(|| Session::from_model(&model, &options)).map_err(py_err) {
                Ok(session) => return InferenceSession::new_from(py, session, policy, source, threads),
                Err(e) if i + 1 < candidates.len() && e.is_instance_of::<Unsupported>(py) => {
                    let message =
                        format!("kiln: backend {} is unavailable ({e}); trying the next provider", backend.name());
                    warn(&py.get_type::<PyUserWarning>(), &message)?;
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Unsupported::new_err("no backend to run on")))
    }

    /// The model's inputs (name, shape, type), in order.
    fn get_inputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        self.session.inputs().iter().map(|(n, t)| node_arg(py, n, t)).collect()
    }

    /// The model's outputs (name, shape, type), in order.
    fn get_outputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        self.session.outputs().iter().map(|(n, t)| node_arg(py, n, t)).collect()
    }

    /// ONNX Runtime's name of the backend the session runs on.
    fn get_providers(&self) -> Vec<&'static str> {
        vec![match self.backend() {
            "cuda" => "CUDAExecutionProvider",
            "interp" => "KilnInterpreter",
            _ => "CPUExecutionProvider",
        }]
    }

    /// The backend the session runs on (`cpu`, `cuda`, `interp`).
    #[getter]
    fn backend(&self) -> &'static str {
        self.session.backend()
    }

    /// The nodes that run on the reference interpreter: `(op, node, why)` for each (empty when all is compiled).
    #[getter]
    fn fallbacks(&self) -> Vec<(String, String, String)> {
        self.session.fallbacks().iter().map(|f| (f.op.clone(), f.node.clone(), f.why.clone())).collect()
    }

    /// Runs the model. `output_names`: the outputs to return, in that order (None: all, in the model's order);
    /// `input_feed`: `{name: array}`. Returns a list of NumPy arrays.
    ///
    /// Arrays that are C-contiguous, aligned and of the input's dtype are read where they lie; others are copied
    /// into that layout first. A dtype other than the input's is an error (no implicit casts). The GIL is
    /// released while the model runs.
    #[pyo3(signature = (output_names, input_feed, run_options=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        output_names: Option<Vec<String>>,
        input_feed: &Bound<'py, PyDict>,
        run_options: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let _ = run_options;
        let wanted: Vec<usize> = match output_names.filter(|n| !n.is_empty()) {
            None => (0..self.session.outputs().len()).collect(),
            Some(names) => names
                .iter()
                .map(|n| {
                    self.session.outputs().iter().position(|(o, _)| o == n).ok_or_else(|| {
                        let all: Vec<String> = self.session.outputs().iter().map(|(o, _)| format!("`{o}`")).collect();
                        invalid_input(format!("the model has no output `{n}` (outputs: {})", all.join(", ")))
                    })
                })
                .collect::<PyResult<_>>()?,
        };
        let np = py.import("numpy")?;
        let mut arrays = Vec::with_capacity(input_feed.len());
        for (k, v) in input_feed.iter() {
            let name: String = k
                .cast::<PyString>()
                .map_err(|_| {
                    invalid_input(format!(
                        "input names are strings, got {}",
                        k.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                    ))
                })?
                .to_string();
            let (array, dtype) = feed_array(&np, &name, &v)?;
            if let Some((_, ty)) = self.session.inputs().iter().find(|(n, _)| *n == name)
                && ty.dtype != dtype
            {
                return Err(invalid_input(format!(
                    "input `{name}` must be {} ({}), got {}",
                    numpy_name(ty.dtype),
                    onnx_type(ty.dtype),
                    numpy_name(dtype)
                )));
            }
            arrays.push((name, array, dtype));
        }
        let mut views = Vec::with_capacity(arrays.len());
        for (name, array, dtype) in &arrays {
            let view = TensorView::new(*dtype, array.shape(), array_bytes(array, *dtype))
                .map_err(|e| invalid_input(format!("input `{name}`: {e}")))?;
            views.push((name.as_str(), view));
        }
        if let Ok(mut bound) = self.bound.lock() {
            bound.clear();
            bound.extend(views.iter().map(|(n, v)| (n.to_string(), v.as_bytes().as_ptr() as usize)));
        }
        let outputs = py.detach(|| self.session.run_views(&views)).map_err(py_err)?;
        let mut slots: Vec<Option<Tensor>> = outputs.into_iter().map(|(_, t)| Some(t)).collect();
        let mut out = Vec::with_capacity(wanted.len());
        for &i in &wanted {
            // An output asked for twice is handed out twice: the second is a copy.
            let t = match slots.get_mut(i).and_then(Option::take) {
                Some(t) => {
                    if wanted.iter().filter(|&&j| j == i).count() > 1 {
                        slots[i] = Some(t.clone());
                    }
                    t
                }
                None => return Err(ExecutionError::new_err(format!("the run returned no output #{i}"))),
            };
            out.push(to_numpy(py, t)?);
        }
        Ok(out)
    }

    /// The address each input of the last run was bound at (`{name: address}`): equal to the array's own data
    /// address when the input was read without a copy. For tests.
    fn _bound_addresses(&self) -> BTreeMap<String, usize> {
        self.bound.lock().map(|b| b.iter().cloned().collect()).unwrap_or_default()
    }

    /// Greedy generation with a decoder step model with a key/value cache (`gpt2_small_step` and its kind):
    /// `max_new_tokens` token ids after `prompt_ids`, resuming from the longest prefix this session has seen
    /// (or from `state`, bytes of an earlier `Generation.state`). Step programs are compiled on first use.
    #[pyo3(signature = (prompt_ids, max_new_tokens, state=None))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt_ids: Vec<u32>,
        max_new_tokens: u32,
        state: Option<&Bound<'_, PyBytes>>,
    ) -> PyResult<Generation> {
        let source = self.source.clone().ok_or_else(|| {
            Unsupported::new_err("generate needs a session opened from an ONNX decoder step model file")
        })?;
        let state = state.map(|s| s.as_bytes().to_vec());
        let threads = self.threads;
        let generator = &self.generator;
        let generated = py.detach(|| -> Result<_, kiln::Error> {
            // Locked with the GIL released: a long generation in one thread does not stall the others.
            let mut slot = generator.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                let options = GenerateOptions {
                    compile: CompileOptions { threads, ..CompileOptions::default() },
                    ..GenerateOptions::default()
                };
                *slot = Some(Generator::open(&source, &options)?);
            }
            let generator = slot.as_mut().expect("opened above");
            let g = match &state {
                Some(bytes) => {
                    let imported = generator.import_state(bytes)?;
                    generator.generate_from(&prompt_ids, max_new_tokens, &imported)?
                }
                None => generator.generate(&prompt_ids, max_new_tokens)?,
            };
            let exported = generator.export_state(&g.state)?;
            let cache = generator.cache_stats();
            Ok((g, exported, cache))
        });
        let (g, exported, cache) = generated.map_err(py_err)?;
        Ok(Generation {
            ids: g.ids,
            logits: to_numpy(py, g.logits)?.unbind(),
            state: PyBytes::new(py, &exported).unbind(),
            reused_prefix_len: g.counters.reused_prefix_len,
            tokens_sent: g.counters.tokens_sent,
            tokens_saved: g.counters.tokens_saved,
            compute_steps: g.counters.compute_steps,
            used_cached_state: g.counters.used_cached_state,
            cache_entries: cache.entries,
            cache_bytes: cache.bytes,
            cache_evicted: cache.evicted,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "kiln.InferenceSession(backend='{}', inputs={}, outputs={})",
            self.backend(),
            self.session.inputs().len(),
            self.session.outputs().len()
        )
    }
}

/// The outcome of `InferenceSession.generate`, with what the prefix cache saved.
#[pyclass(frozen, module = "kiln")]
struct Generation {
    /// The generated token ids.
    #[pyo3(get)]
    ids: Vec<u32>,
    /// float32 `[len(ids), vocab]`: row i holds the logits `ids[i]` was picked from.
    #[pyo3(get)]
    logits: Py<PyAny>,
    /// The state after the request (prompt and generated tokens), as bytes: pass it back as `state=`, in this
    /// process or another.
    #[pyo3(get)]
    state: Py<PyBytes>,
    /// Prompt tokens covered by the cached or given state.
    #[pyo3(get)]
    reused_prefix_len: u32,
    /// Tokens fed to the model.
    #[pyo3(get)]
    tokens_sent: u32,
    /// Tokens not fed because a state covered them.
    #[pyo3(get)]
    tokens_saved: u32,
    /// Model invocations.
    #[pyo3(get)]
    compute_steps: u32,
    /// Whether a prefix state was used.
    #[pyo3(get)]
    used_cached_state: bool,
    /// States the session's prefix cache holds.
    #[pyo3(get)]
    cache_entries: usize,
    /// Bytes the prefix cache holds.
    #[pyo3(get)]
    cache_bytes: u64,
    /// States the prefix cache has evicted so far.
    #[pyo3(get)]
    cache_evicted: u64,
}

#[pymethods]
impl Generation {
    fn __repr__(&self) -> String {
        format!(
            "Generation(ids={:?}, reused_prefix_len={}, tokens_saved={})",
            self.ids, self.reused_prefix_len, self.tokens_saved
        )
    }
}

/// Loads an artifact directory written by `kiln compile` (or `kiln.compile`): no code generation.
#[pyfunction]
#[pyo3(signature = (artifact_dir, *, threads=None, fallback="warn"))]
fn load(py: Python<'_>, artifact_dir: PathBuf, threads: Option<usize>, fallback: &str) -> PyResult<InferenceSession> {
    let policy = fallback_policy(fallback)?;
    if !kiln::Artifact::is_artifact(&artifact_dir) {
        return Err(InvalidModel::new_err(format!(
            "{}: not an artifact directory (no manifest.json; `kiln compile` or kiln.compile writes one)",
            artifact_dir.display()
        )));
    }
    let threads = threads.unwrap_or(0);
    let options = SessionOptions { threads, fallback: policy, ..Default::default() };
    let session = py.detach(|| Session::open(&artifact_dir, &options)).map_err(py_err)?;
    InferenceSession::new_from(py, session, policy, None, threads)
}

/// Compiles a model ahead of time into an artifact directory that `kiln.load` (or `kiln run`, or the C API)
/// loads without the compiler. `target`: `cpu` (a shared library for this host) or `cuda` (PTX for `arch`).
/// Returns the artifact directory.
#[pyfunction]
#[pyo3(signature = (model, out_dir, *, target="cpu", shapes=None, arch="sm_80", fallback="warn"))]
fn compile(
    py: Python<'_>,
    model: PathBuf,
    out_dir: PathBuf,
    target: &str,
    shapes: Option<BTreeMap<String, Vec<usize>>>,
    arch: &str,
    fallback: &str,
) -> PyResult<PathBuf> {
    let policy = fallback_policy(fallback)?;
    let target: Backend = target.parse().map_err(|e: String| Unsupported::new_err(e))?;
    let Some(pipeline) = target.info().pipeline.filter(|_| target.info().compile_target) else {
        return Err(Unsupported::new_err(format!(
            "target {} is not a compile target: {}",
            target.name(),
            target.info().not_compiled
        )));
    };
    let arch: kiln_codegen::ptx::PtxArch =
        arch.parse().map_err(|e: String| pyo3::exceptions::PyValueError::new_err(e))?;
    let options = CompileOptions {
        backend: target,
        pipeline: pipeline.to_string(),
        threads: 0,
        backends: BackendRegistry::from_env().map_err(|e| py_err(kiln::Error::Run(e)))?,
        fallback: policy.reported_by_caller(),
    };
    let load = LoadOptions { shapes: shape_map(shapes), ..Default::default() };
    let lowered = py
        .detach(|| -> Result<_, kiln::Error> {
            let lowered = Model::load(&model, &load)?.lower(&options)?;
            if target == Backend::Cuda {
                let ptx = kiln_codegen::ptx::PtxOptions { arch, ..Default::default() };
                kiln::Artifact::write_cuda(&lowered, &out_dir, &ptx)?;
            } else {
                kiln::Artifact::write(&lowered, &out_dir)?;
            }
            Ok(lowered)
        })
        .map_err(py_err)?;
    warn_fallbacks(py, &lowered.report.fallbacks, policy)?;
    Ok(out_dir)
}

/// Every op, attribute value and dtype of an ONNX model that kiln does not import, at once: a list of
/// `(op_type, node, message)` (empty when the whole model imports).
#[pyfunction]
#[pyo3(signature = (model, *, shapes=None))]
fn check(
    py: Python<'_>,
    model: PathBuf,
    shapes: Option<BTreeMap<String, Vec<usize>>>,
) -> PyResult<Vec<(String, String, String)>> {
    let options = kiln_onnx::ImportOptions { shapes: shape_map(shapes), ..Default::default() };
    let found = py.detach(|| kiln_onnx::check(&model, &options)).map_err(|e| match e {
        e @ kiln_onnx::ImportError::Io { .. } => InvalidModel::new_err(e.to_string()),
        e => InvalidModel::new_err(format!("{}: {e}", model.display())),
    })?;
    Ok(found.into_iter().map(|u| (u.op_type, u.node, u.message)).collect())
}

/// The ONNX ops kiln imports (other domains' as `domain.OpType`, e.g. `com.microsoft.QGemm`).
#[pyfunction]
fn supported_ops() -> Vec<String> {
    kiln_onnx::supported_ops()
}

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<InferenceSession>()?;
    m.add_class::<NodeArg>()?;
    m.add_class::<Generation>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(supported_ops, m)?)?;
    m.add("KilnError", py.get_type::<KilnError>())?;
    m.add("InvalidModel", py.get_type::<InvalidModel>())?;
    m.add("Unsupported", py.get_type::<Unsupported>())?;
    m.add("InvalidInput", py.get_type::<InvalidInput>())?;
    m.add("ExecutionError", py.get_type::<ExecutionError>())?;
    m.add("FallbackWarning", py.get_type::<FallbackWarning>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

//! `kiln-onnx`: the ONNX front end, turning an ONNX `ModelProto` into a [`kiln_ir::Graph`].
//!
//! Import walks the graph once in node order. Each ONNX op has a handler (`ops/`) that maps it onto IR ops through
//! the builder, so every node is type-checked as it lands. Values whose contents are known at import time
//! (initializers, `Constant` nodes, and anything computed only from them — the `Shape`→`Gather`→`Concat` chains
//! exporters emit) are folded on the spot with the reference interpreter, so with static input shapes shape
//! arithmetic resolves to constants. Shape tensors of inputs with symbolic dims are tracked dim by dim, so a
//! `Reshape` to `[batch, -1]` still resolves.
//!
//! Nothing stops at the first problem: an unsupported op, attribute value or dtype is recorded with its node, the
//! node's results are marked unavailable (their users are not reported again), and the walk goes on. Import then
//! fails with the complete list ([`ImportError::Unsupported`]); [`check`] returns it.

mod import;
mod node;
mod ops;
pub mod tensor;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

pub use import::import_model;

/// Options for import.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Static extents for graph inputs (name → dims), replacing symbolic or unknown dims.
    pub shapes: BTreeMap<String, Vec<usize>>,
    /// Values to specialize graph inputs on: each such input becomes a constant of the imported graph (so an
    /// `axes`, `pads` or `sizes` operand fed by it resolves) and is no longer an input.
    pub known_inputs: BTreeMap<String, kiln_ir::Tensor>,
}

/// One thing kiln cannot import, located by node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The node's name (or `#index` when it has none).
    pub node: String,
    /// Its op type, with the domain when not the default one.
    pub op_type: String,
    /// What is not supported.
    pub message: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (node `{}`): {}", self.op_type, self.node, self.message)
    }
}

/// Why an ONNX model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// The bytes are not a valid ONNX model.
    #[error("not a valid ONNX model: {0}")]
    Decode(String),
    /// The model is malformed (undefined values, inconsistent initializers…).
    #[error("invalid model: {0}")]
    Invalid(String),
    /// The shapes or values given for the model's inputs (`ImportOptions`) do not fit them: an unknown name, a
    /// rank or static extent that contradicts the declaration.
    #[error("{0}")]
    Input(String),
    /// Every unsupported op, attribute value and dtype, by node.
    #[error("the model uses {} unsupported feature(s):\n{}", .0.len(), .0.iter().map(|u| format!("  {u}")).collect::<Vec<_>>().join("\n"))]
    Unsupported(Vec<Unsupported>),
}

/// Reads and imports an ONNX file; external data resolves against its folder.
pub fn import(path: &Path, options: &ImportOptions) -> Result<kiln_ir::Graph, ImportError> {
    let bytes = kiln_ir::io::read_file(path)
        .map_err(|e| ImportError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    import_bytes(&bytes, base, options)
}

/// Imports ONNX bytes; `base_dir` is where external data files live (`None` refuses external data).
pub fn import_bytes(
    bytes: &[u8],
    base_dir: Option<&Path>,
    options: &ImportOptions,
) -> Result<kiln_ir::Graph, ImportError> {
    use protobuf::Message;
    let model = onnx_protobuf::ModelProto::parse_from_bytes(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    import_model(&model, base_dir, options)
}

/// The names of the graph inputs a caller feeds (initializers excluded) and of the graph outputs, in order, read
/// from an ONNX file without importing it: what positional test data and positional feeds bind to.
pub fn port_names(path: &Path) -> Result<(Vec<String>, Vec<String>), ImportError> {
    use protobuf::Message;
    let bytes = kiln_ir::io::read_file(path)
        .map_err(|e| ImportError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let model = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    let g = model.graph.as_ref().ok_or_else(|| ImportError::Invalid("the model has no graph".into()))?;
    let init: std::collections::HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    let inputs = g.input.iter().filter(|i| !init.contains(i.name.as_str())).map(|i| i.name.clone()).collect();
    Ok((inputs, g.output.iter().map(|o| o.name.clone()).collect()))
}

/// How many nodes of each ONNX op type the model's graph holds (with the domain when not the default one, as
/// `com.microsoft.QGemm`), nodes of subgraphs (an `If`'s branches, a `Loop`'s body) included: what `kiln inspect`
/// shows beside the IR ops.
pub fn op_types(path: &Path) -> Result<std::collections::BTreeMap<String, usize>, ImportError> {
    use protobuf::Message;
    fn count(g: &onnx_protobuf::GraphProto, out: &mut std::collections::BTreeMap<String, usize>, depth: usize) {
        for node in &g.node {
            let op = if node.domain.is_empty() || node.domain == "ai.onnx" {
                node.op_type.clone()
            } else {
                format!("{}.{}", node.domain, node.op_type)
            };
            *out.entry(op).or_default() += 1;
            // Nested graphs are bounded by the protobuf's own recursion limit; this bounds the walk too.
            if depth < 64 {
                for a in &node.attribute {
                    for sub in a.g.iter().chain(&a.graphs) {
                        count(sub, out, depth + 1);
                    }
                }
            }
        }
    }
    let bytes = kiln_ir::io::read_file(path)
        .map_err(|e| ImportError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let model = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    let g = model.graph.as_ref().ok_or_else(|| ImportError::Invalid("the model has no graph".into()))?;
    let mut out = std::collections::BTreeMap::new();
    count(g, &mut out, 0);
    Ok(out)
}

/// Every unsupported feature of a model (empty when it imports), or an error for unreadable/invalid models.
pub fn check(path: &Path, options: &ImportOptions) -> Result<Vec<Unsupported>, ImportError> {
    match import(path, options) {
        Ok(_) => Ok(Vec::new()),
        Err(ImportError::Unsupported(list)) => Ok(list),
        Err(e) => Err(e),
    }
}

/// The ONNX op types kiln imports, sorted: the default domain's by name, the others as `domain.OpType` (ONNX
/// Runtime's contrib ops: `com.microsoft.QGemm`), the form [`op_types`] and `kiln inspect` use.
pub fn supported_ops() -> Vec<String> {
    let default = ops::TABLE.iter().map(|(n, _)| *n).chain(ops::sequence::OPS.iter().copied()).map(str::to_string);
    let contrib = ops::contrib::op_types().map(|n| format!("com.microsoft.{n}"));
    let mut v: Vec<String> = default.chain(contrib).collect();
    v.sort_unstable();
    v
}

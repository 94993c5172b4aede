//! `kiln-onnx`: the ONNX front end, turning an ONNX `ModelProto` into a `kiln_ir::Graph`.
//!
//! Owns opset handling, initializers and external data, shape-arithmetic chains, and the complete list of
//! unsupported ops reported in one error. The importer arrives with the ONNX issue.

pub use kiln_ir as ir;

//! `kiln`: the library facade over the compiler crates.
//!
//! Load a model (`.kir` text or a builder graph; ONNX with the front-end issue), then run it. Today the only
//! executor is the reference interpreter.

pub use kiln_ir as ir;

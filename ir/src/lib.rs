//! `kiln-ir`: the typed tensor-graph IR every other kiln crate speaks.
//!
//! It owns dtypes and shapes ([`types`]), concrete tensors ([`tensor`]), the closed op set ([`op`]) with typed
//! attributes ([`attr`]) and type rules ([`infer`]), the [`Graph`] itself, the [`Builder`], the `.kir` text form
//! ([`print`], [`parse`]), the serde form, the [`verify`] pass that reports every error at once, and the reference
//! interpreter [`interp`] that defines what every op means. It knows nothing of passes, targets or file formats
//! other than `.kir`.

pub mod attr;
pub mod builder;
pub mod dim;
pub mod fusion;
pub mod graph;
pub mod infer;
pub mod interp;
pub mod io;
pub mod memory;
pub mod narrow;
pub mod op;
pub mod parse;
pub mod print;
pub mod quant;
pub mod random;
pub mod tensor;
pub mod types;
pub mod verify;

pub use builder::Builder;
pub use graph::{Graph, GraphDoc, Node, NodeId, Value, Weights};
pub use memory::MemoryPlan;
pub use op::Op;
pub use parse::{ParseError, parse};
pub use print::print;
pub use tensor::{Data, Element, Tensor, TensorView};
pub use types::{DType, Dim, Shape, TensorType};
pub use verify::{VerifyError, VerifyErrorKind, verify, verify_weights_bound};

/// Errors of the IR crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Building a node failed type inference.
    #[error("{op}{}: {message}", node.as_ref().map(|n| format!(" `{n}`")).unwrap_or_default())]
    Build {
        /// The op's mnemonic.
        op: String,
        /// The node's name, if it has one.
        node: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// `.kir` text did not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The graph is malformed; every problem is listed.
    #[error("the graph has {} error(s):\n{}", .0.len(), .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Verify(Vec<VerifyError>),
    /// The interpreter could not evaluate a node.
    #[error(transparent)]
    Interp(#[from] interp::InterpError),
}

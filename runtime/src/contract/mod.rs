//! The backend contracts kiln was built to honour, as narrow Rust traits tied together by associated types.
//!
//! Two families, one module each:
//! - [`backend`]: the object-safe [`Backend`] every executor of graph nodes implements — capabilities as data,
//!   `run_with_cache` with prefix state and counters, optional state export/import. The registry
//!   ([`crate::registry`]) picks one per node by capability and priority; plugins ([`crate::plugin`]) load more
//!   through a versioned C ABI.
//! - capability traits for backend-native work: [`SubmissionBackend`] (executors and exact [`Completion`]s),
//!   [`ParameterBackend`] (checkpoint weights), [`TransferBackend`] (host ↔ execution storage) and collectives. Each is
//!   static (associated types, no `dyn`), because their users are generic orchestration code that must not pay
//!   for dynamic dispatch per tensor.
//!
//! `docs/runtime.md` maps every item of the seed contracts to its place here.

pub mod backend;
pub mod collective;
pub mod completion;
pub mod parameters;
pub mod submission;
pub mod transfer;

pub use backend::{Backend, BackendState, Capabilities, Counters, Node, NodeKind, OpSupport, RunResult, StateHandle};
pub use collective::{CollectiveBackend, CollectiveGroup, ReduceOp};
pub use completion::Completion;
pub use parameters::ParameterBackend;
pub use submission::SubmissionBackend;
pub use transfer::TransferBackend;

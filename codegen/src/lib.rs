//! `kiln-codegen`: lowering of fusion groups to the target-independent kernel IR, the Cranelift CPU emitter, the
//! NVPTX emitter, and the `Executable` they produce.
//!
//! Nothing here runs on a device outside tests. The emitters arrive with the CPU and GPU backend issues; for now
//! this crate re-exports the IR it will lower.

pub use kiln_ir as ir;

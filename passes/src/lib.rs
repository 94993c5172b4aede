//! `kiln-passes`: the pass manager, the registry of optimization passes, and textual pipelines.
//!
//! Owns the `Pass` trait, pipelines parsed from and printed to text (`canonicalize,cse,fuse`), the named levels
//! `O0`–`O3`, instrumentation, and one module per pass. It never emits code. The passes themselves arrive with the
//! pass-pipeline issue; for now this crate re-exports the IR it will transform.

pub use kiln_ir as ir;

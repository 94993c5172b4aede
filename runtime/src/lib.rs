//! `kiln-runtime`: the backend contracts (submission, parameters, transfer, collectives, stateful execution),
//! the backend registry and C-ABI plugin loader, and the CPU and CUDA backends.
//!
//! It executes plans; it never calls the compiler and does not depend on `kiln-passes`. Backends arrive with the
//! CPU backend and runtime-contract issues; the interpreter in `kiln-ir` is the only executor until then.

pub use kiln_ir as ir;

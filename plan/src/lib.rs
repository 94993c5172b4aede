//! `kiln-plan`: the contract between kiln's compiler and its runtime — what the compiler hands over and the
//! runtime executes, with no code generator behind it (no Cranelift, no LLVM), so a runtime-only build serves
//! artifacts.
//!
//! - [`kernel`]: the loop-level kernel IR (both emitters translate it; the runtime evaluates it for reference
//!   runs and reads launch facts written in its index expressions);
//! - [`exec`]: the [`exec::Executable`] — steps, buffers and where they live, kernels;
//! - [`cpu`]: the CPU kernel ABI, launch facts, target description and the runtime function table compiled code
//!   calls;
//! - [`device`]: device plans and PTX launch facts;
//! - [`weights`]: weight fingerprints and provenance;
//! - [`verify`]: the program verifier (compiler output and artifacts alike);
//! - [`artifact`]: the ahead-of-time artifact manifest, its reader and its checks.

pub mod artifact;
pub mod cpu;
pub mod device;
pub mod exec;
pub mod kernel;
pub mod verify;
pub mod weights;

pub use kiln_ir as ir;

//! Loading the kernel library of an ahead-of-time artifact: a shared object linked from
//! [`kiln_codegen::cpu::emit_object`]'s output, turned into [`KernelCode::Native`] without generating code.
//!
//! The library's runtime table must be filled before any kernel runs (see [`kiln_codegen::cpu::runtime`]); the
//! loader checks that the library expects exactly as many entries as this build provides, so a library from a
//! build with a different table is refused instead of calling through a wrong pointer.

use std::path::Path;

use kiln_codegen::cpu::runtime::{
    RUNTIME_TABLE_LEN_SYMBOL, RUNTIME_TABLE_SYMBOL, install_runtime_table, runtime_table,
};
use kiln_codegen::cpu::{KernelFn, KernelInfo};

use crate::RunError;
use crate::cpu::KernelCode;

/// Opens the kernel library at `path`, fills its runtime table and resolves every kernel of `infos` by its
/// symbol. The library stays loaded as long as the returned code lives.
///
/// # Safety
/// `path` must be a library produced by linking [`kiln_codegen::cpu::emit_object`]'s object for exactly these
/// `infos`: loading runs its initializers, and each symbol is called as a [`KernelFn`]. A library that merely
/// lacks a symbol or has a different table size is reported, not trusted.
pub unsafe fn load_kernel_library(path: &Path, infos: &[KernelInfo]) -> Result<KernelCode, RunError> {
    let fail = |message: String| RunError::Load { path: path.display().to_string(), message };
    // SAFETY: the caller vouches that the file is a kernel library, whose loading runs no code of its own.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| fail(format!("cannot load: {e}")))?;
    let expected = runtime_table().len() as u64;
    // SAFETY: `kiln_rt_table_len` is a `u64` in every kernel library (see `emit_object`).
    let len = unsafe { library.get::<*const u64>(RUNTIME_TABLE_LEN_SYMBOL.as_bytes()) }
        .map_err(|e| fail(format!("no `{RUNTIME_TABLE_LEN_SYMBOL}`: {e}")))?;
    // SAFETY: the symbol's address is that of the library's `u64`, alive while `library` is.
    let len = unsafe { (*len).read_unaligned() };
    if len != expected {
        return Err(fail(format!(
            "its runtime table has {len} entries but this kiln provides {expected}: recompile the artifact"
        )));
    }
    // SAFETY: `kiln_rt_table` is a writable array of pointers in every kernel library.
    let table = unsafe { library.get::<*mut *const u8>(RUNTIME_TABLE_SYMBOL.as_bytes()) }
        .map_err(|e| fail(format!("no `{RUNTIME_TABLE_SYMBOL}`: {e}")))?;
    // SAFETY: its length was checked above, and no kernel of the just-loaded library can be running.
    unsafe { install_runtime_table(*table) };
    let mut entries = Vec::with_capacity(infos.len());
    for info in infos {
        // SAFETY: every kernel symbol of a kernel library is a function of type `KernelFn`.
        let f = unsafe { library.get::<KernelFn>(info.symbol.as_bytes()) }
            .map_err(|e| fail(format!("kernel `{}`: no symbol `{}`: {e}", info.name, info.symbol)))?;
        entries.push((*f, info.clone()));
    }
    Ok(KernelCode::Native { entries, owner: Box::new(library) })
}

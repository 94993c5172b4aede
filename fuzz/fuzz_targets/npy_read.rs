#![no_main]
//! Fuzz target `npy_read`: see `fuzz/src/runtime_props.rs`.

#[path = "../src/runtime_props.rs"]
#[allow(dead_code)] // each target uses one property
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::npy_read(data));

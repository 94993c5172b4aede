//! Fuzz target: the first 8 bytes of the input (little-endian, zero-padded) are a `kiln::difftest` seed; the
//! random graph it names, compiled for the CPU, must match the reference interpreter.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut bytes = [0u8; 8];
    let n = data.len().min(8);
    bytes[..n].copy_from_slice(&data[..n]);
    if let Err(e) = kiln::difftest::check(u64::from_le_bytes(bytes)) {
        panic!("{e}");
    }
});

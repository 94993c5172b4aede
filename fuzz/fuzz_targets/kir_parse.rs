//! Fuzz target: arbitrary text through the `.kir` parser must never panic, and printing a parsed graph is a
//! fixed point of parse-then-print.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kiln_fuzz::kir_parse(data));

//! The random stream of the fuzz smoke tests (`onnx/tests/fuzz_smoke.rs`, `runtime/tests/fuzz_smoke.rs`, which
//! both include this file): xorshift64*, small, deterministic, good enough to pick mutations.

/// xorshift64* from a seed.
pub struct Rng(pub u64);

#[allow(dead_code)] // each smoke test uses part of it
impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }

    /// One of `v`, uniformly; `v` must not be empty.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }

    /// An integer that tends to break things: small, boundary or huge, either sign.
    pub fn nasty_int(&mut self) -> i64 {
        *self.pick(&[0, 1, -1, 2, -2, 3, 7, 64, -64, 1 << 20, 1 << 31, i32::MAX as i64, i64::MAX, i64::MIN, 1 << 40])
    }
}

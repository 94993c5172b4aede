//! The byte format of an exported [`KvState`]: versioned, checksummed, and checked against the model on import.
//!
//! Layout (integers little-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `KILNSTAT` |
//! | 8 | 4 | format version, u32 (this build writes and reads [`VERSION`]) |
//! | 12 | 8 | body length in bytes, u64 |
//! | 20 | 4 | CRC-32 (IEEE) of the body, u32 |
//! | 24 | … | body |
//!
//! Body: model fingerprint u64; dtype code u8 (1 f32, 2 f16, 3 bf16, 4 f64); layers, heads, head_dim and
//! token count T, each u32; T token ids, u32 each; then per layer the key and then the value tensor,
//! `[1, heads, T, head_dim]` row-major, in the dtype's little-endian bytes.
//!
//! The checksum is CRC-32 (the zlib/PNG polynomial, from the `crc32fast` crate): it detects the corruption this
//! guards against (truncation, flipped bits, a different file). The model fingerprint ([`fingerprint`]) is the
//! BLAKE3 digest of the model file's bytes, truncated to 64 bits: it tells models apart.

use kiln_ir::{DType, Tensor};

use super::kv::{DecoderSpec, KvState};
use crate::RunError;

/// The file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"KILNSTAT";
/// The format version this build writes and reads (2: BLAKE3 model fingerprints).
pub const VERSION: u32 = 2;
const HEADER: usize = 24;

/// The exported bytes of `state`.
pub fn encode(state: &KvState) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&state.fingerprint().to_le_bytes());
    body.push(dtype_code(state.dtype()));
    for n in [state.layers().len(), state.heads(), state.head_dim(), state.tokens().len()] {
        body.extend_from_slice(&(n as u32).to_le_bytes());
    }
    for t in state.tokens() {
        body.extend_from_slice(&t.to_le_bytes());
    }
    for t in state.layers().iter().flatten() {
        body.extend_from_slice(&le_bytes(t));
    }
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Rebuilds a state from [`encode`]'s bytes, for the model `spec` describes with `fingerprint`. Every way the
/// bytes can be wrong (magic, version, length, checksum, model, shapes, token ids) is a [`RunError::State`]
/// saying which; nothing is allocated beyond what the checked header announces and the bytes hold.
pub fn decode(bytes: &[u8], spec: &DecoderSpec, fingerprint: u64) -> Result<KvState, RunError> {
    let err = |m: String| RunError::State(m);
    if bytes.len() < HEADER {
        return Err(err(format!("truncated: {} bytes, shorter than the {HEADER}-byte header", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(err("not a kiln state file (bad magic)".into()));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(err(format!("state format version {version} is not supported (this build reads {VERSION})")));
    }
    let declared = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let body = &bytes[HEADER..];
    if declared != body.len() as u64 {
        let what = if (body.len() as u64) < declared { "truncated" } else { "trailing bytes" };
        return Err(err(format!("{what}: the header announces {declared} body bytes, the file has {}", body.len())));
    }
    let stored = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
    let computed = crc32(body);
    if stored != computed {
        return Err(err(format!(
            "checksum mismatch (stored {stored:08x}, computed {computed:08x}): the state is corrupt"
        )));
    }
    let mut r = Reader { bytes: body, at: 0 };
    let fp = r.u64()?;
    if fp != fingerprint {
        return Err(err(format!(
            "the state was computed by a different model (fingerprint {fp:016x}, this model {fingerprint:016x})"
        )));
    }
    let dtype = dtype_from_code(r.u8()?)?;
    let (layers, heads, head_dim, tokens) =
        (r.u32()? as usize, r.u32()? as usize, r.u32()? as usize, r.u32()? as usize);
    if (layers, heads, head_dim, dtype) != (spec.layers(), spec.heads, spec.head_dim, spec.dtype) {
        return Err(err(format!(
            "the state is {layers} layers x {heads} heads x {head_dim} head_dim of {dtype}, the model {} x {} x {} of {}",
            spec.layers(),
            spec.heads,
            spec.head_dim,
            spec.dtype
        )));
    }
    if tokens == 0 {
        return Err(err("the state covers no tokens".into()));
    }
    // The sizes are checked against the bytes at hand before anything is allocated.
    let tensor_bytes = heads
        .checked_mul(tokens)
        .and_then(|n| n.checked_mul(head_dim))
        .and_then(|n| n.checked_mul(dtype.size_bytes()))
        .ok_or_else(|| err("the state's sizes overflow".into()))?;
    let needed = tokens
        .checked_mul(4)
        .and_then(|t| tensor_bytes.checked_mul(2 * layers).and_then(|b| b.checked_add(t)))
        .ok_or_else(|| err("the state's sizes overflow".into()))?;
    if needed != r.left() {
        return Err(err(format!(
            "the state announces {needed} bytes of tokens and tensors, the body holds {}",
            r.left()
        )));
    }
    let ids = (0..tokens).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
    let mut pairs = Vec::with_capacity(layers);
    for _ in 0..layers {
        let mut pair = Vec::with_capacity(2);
        for _ in 0..2 {
            let raw = r.take(tensor_bytes)?;
            pair.push(from_le_bytes(dtype, vec![1, heads, tokens, head_dim], raw)?);
        }
        let [k, v]: [Tensor; 2] = pair.try_into().expect("two tensors");
        pairs.push([k, v]);
    }
    let state = KvState::new(fp, ids, pairs)?;
    state.check_fits(spec, fingerprint)?;
    Ok(state)
}

/// CRC-32 (IEEE 802.3), as zlib and PNG compute it (the `crc32fast` crate).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// A 64-bit fingerprint of a model file's bytes: the first eight bytes of their BLAKE3 digest. Equal bytes give
/// equal fingerprints in every build; different models differ with overwhelming likelihood, and a crafted
/// collision is as hard as one of BLAKE3 truncated to 64 bits.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let digest = blake3::hash(bytes);
    u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("a BLAKE3 digest has 32 bytes"))
}

fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        DType::F64 => 4,
        // KvState::new and DecoderSpec only admit float key/value tensors.
        other => unreachable!("a key/value state of {other}"),
    }
}

fn dtype_from_code(c: u8) -> Result<DType, RunError> {
    Ok(match c {
        1 => DType::F32,
        2 => DType::F16,
        3 => DType::BF16,
        4 => DType::F64,
        _ => return Err(RunError::State(format!("unknown dtype code {c}"))),
    })
}

/// A tensor's elements as little-endian bytes (the host order on every supported target; converted otherwise).
fn le_bytes(t: &Tensor) -> Vec<u8> {
    if cfg!(target_endian = "little") { t.as_bytes().to_vec() } else { t.data().to_le_bytes() }
}

fn from_le_bytes(dtype: DType, shape: Vec<usize>, raw: &[u8]) -> Result<Tensor, RunError> {
    let bad = || RunError::State("tensor bytes do not fit their shape".into());
    if cfg!(target_endian = "little") {
        Tensor::from_bytes(dtype, shape, raw).ok_or_else(bad)
    } else {
        let data = kiln_ir::tensor::Data::from_le_bytes(dtype, raw).ok_or_else(bad)?;
        Tensor::new(shape, data).map_err(|_| bad())
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RunError> {
        if n > self.left() {
            return Err(RunError::State(format!("truncated body: {n} bytes needed at offset {}", self.at)));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, RunError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, RunError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, RunError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> DecoderSpec {
        DecoderSpec {
            input_ids: "input_ids".into(),
            position_ids: "position_ids".into(),
            attention_mask: "attention_mask".into(),
            past: vec![["pk".into(), "pv".into()]; 2],
            present: vec![["k".into(), "v".into()]; 2],
            logits: "logits".into(),
            heads: 2,
            head_dim: 3,
            vocab: 50,
            dtype: DType::F32,
            max_positions: None,
        }
    }

    fn state(fp: u64) -> KvState {
        let t = |seed| Tensor::random(DType::F32, vec![1, 2, 4, 3], seed);
        KvState::new(fp, vec![5, 9, 2, 49], vec![[t(1), t(2)], [t(3), t(4)]]).unwrap()
    }

    fn error(bytes: &[u8]) -> String {
        decode(bytes, &spec(), 42).expect_err("the bytes must be refused").to_string()
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn fingerprints_are_stable_and_tell_bytes_apart() {
        assert_eq!(fingerprint(b"model bytes"), fingerprint(b"model bytes"));
        assert_ne!(fingerprint(b"model bytes"), fingerprint(b"model bytez"));
        assert_ne!(fingerprint(&[0; 16]), fingerprint(&[0; 17]));
    }

    #[test]
    fn a_state_round_trips() {
        let s = state(42);
        let bytes = encode(&s);
        assert_eq!(&bytes[..8], b"KILNSTAT");
        assert_eq!(decode(&bytes, &spec(), 42).unwrap(), s);
    }

    #[test]
    fn every_kind_of_bad_bytes_is_a_clear_error() {
        let good = encode(&state(42));
        assert!(error(&good[..10]).contains("shorter than the 24-byte header"));
        assert!(error(&good[..good.len() - 1]).contains("truncated"));
        let mut longer = good.clone();
        longer.push(0);
        assert!(error(&longer).contains("trailing bytes"));
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(error(&magic).contains("bad magic"));
        let mut version = good.clone();
        version[8] = 7;
        assert!(error(&version).contains("version 7 is not supported"));
        let mut flipped = good.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x10;
        assert!(error(&flipped).contains("checksum mismatch"));
        assert!(error(&encode(&state(7))).contains("different model"));
        let mut other = spec();
        other.heads = 4;
        let e = decode(&good, &other, 42).unwrap_err().to_string();
        assert!(e.contains("2 heads") && e.contains("4 x"), "{e}");
        let mut small_vocab = spec();
        small_vocab.vocab = 10;
        assert!(decode(&good, &small_vocab, 42).unwrap_err().to_string().contains("beyond the vocabulary"));
        assert!(error(b"").contains("header"));
    }

    #[test]
    fn no_truncation_or_flipped_byte_is_accepted_or_panics() {
        let good = encode(&state(42));
        for n in 0..good.len() {
            assert!(decode(&good[..n], &spec(), 42).is_err(), "a {n}-byte prefix");
        }
        for at in 0..good.len() {
            for bit in [0x01, 0x80] {
                let mut bad = good.clone();
                bad[at] ^= bit;
                assert!(decode(&bad, &spec(), 42).is_err(), "bit {bit:#x} of byte {at}");
            }
        }
    }

    #[test]
    fn a_consistent_checksum_over_lying_sizes_is_still_refused() {
        // Rewrite the token count to a huge value and fix up the checksum: the sizes check must catch it
        // before allocating.
        let good = encode(&state(42));
        let mut body = good[HEADER..].to_vec();
        body[8 + 1 + 12..8 + 1 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut bytes = good[..HEADER].to_vec();
        bytes[20..24].copy_from_slice(&crc32(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        assert!(error(&bytes).contains("announces"), "{}", error(&bytes));
    }
}

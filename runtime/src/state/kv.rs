//! What a decoder step model looks like ([`DecoderSpec`]) and the state it carries between steps ([`KvState`]).
//!
//! A decoder step model takes the new tokens (`input_ids`, `position_ids`, both `[1, S]`), an attention mask over
//! past and new positions (`[1, P + S]`) and, per layer, the key and value tensors of the `P` past positions
//! (`[1, heads, P, head_dim]`); it returns the logits of the new positions (`[1, S, vocab]`) and, per layer, the
//! keys and values of all `P + S` positions. A [`KvState`] is exactly those per-layer tensors for a token prefix,
//! plus the tokens themselves and the fingerprint of the model that computed them.
//!
//! Invariant of a [`KvState`]: every tensor is `[1, heads, tokens.len(), head_dim]` of one dtype, and position
//! `i` of every tensor was computed from `tokens[..=i]`.

use kiln_ir::{DType, Tensor, TensorType};

use crate::RunError;
use crate::contract::StateHandle;
use crate::prefix_cache::{CachedState, Token};

/// The names and sizes of a decoder step model's inputs and outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderSpec {
    /// The new tokens' ids, i64 `[1, S]`.
    pub input_ids: String,
    /// The new tokens' positions, i64 `[1, S]`.
    pub position_ids: String,
    /// Ones over past and new positions, i64 `[1, P + S]`.
    pub attention_mask: String,
    /// Per layer, the past key and value inputs (`[1, heads, P, head_dim]`).
    pub past: Vec<[String; 2]>,
    /// Per layer, the present key and value outputs (`[1, heads, P + S, head_dim]`), in the order of `past`.
    pub present: Vec<[String; 2]>,
    /// The logits output, f32 `[1, S, vocab]`.
    pub logits: String,
    /// Attention heads.
    pub heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Vocabulary size: token ids are below it.
    pub vocab: usize,
    /// The key/value dtype.
    pub dtype: DType,
    /// How many positions the model can see (its position-embedding table), when known.
    pub max_positions: Option<usize>,
}

impl DecoderSpec {
    /// Layers (key/value pairs).
    pub fn layers(&self) -> usize {
        self.past.len()
    }

    /// Bytes of key/value data one token position holds, over all layers.
    pub fn bytes_per_position(&self) -> u64 {
        (2 * self.layers() * self.heads * self.head_dim * self.dtype.size_bytes()) as u64
    }

    /// The spec of a GPT-2 style step model, from its inputs and outputs (names and types): inputs
    /// `input_ids`, `position_ids`, `attention_mask` and `past_key_values.{i}.{key,value}`; outputs `logits` and
    /// `present.{i}.{key,value}`. Heads, head size and vocabulary must be static; anything else the model needs
    /// is an error naming it.
    pub fn from_signature(
        inputs: &[(String, TensorType)],
        outputs: &[(String, TensorType)],
    ) -> Result<DecoderSpec, RunError> {
        let bad = |m: String| RunError::Unsupported { node: "decoder".into(), reason: m };
        let input = |n: &str| inputs.iter().find(|(name, _)| name == n).map(|(_, t)| t);
        let output = |n: &str| outputs.iter().find(|(name, _)| name == n).map(|(_, t)| t);
        for name in ["input_ids", "position_ids", "attention_mask"] {
            match input(name) {
                Some(t) if t.dtype == DType::I64 && t.shape.rank() == 2 => {}
                Some(t) => return Err(bad(format!("input `{name}` must be i64 [1,S], the model has {t}"))),
                None => return Err(bad(format!("the model has no input `{name}`; not a decoder step model"))),
            }
        }
        let mut past = Vec::new();
        let mut present = Vec::new();
        let mut dims: Option<(usize, usize, DType)> = None;
        while let Some(key_ty) = input(&format!("past_key_values.{}.key", past.len())) {
            let layer = past.len();
            let names = [format!("past_key_values.{layer}.key"), format!("past_key_values.{layer}.value")];
            let outs = [format!("present.{layer}.key"), format!("present.{layer}.value")];
            let tys = [Some(key_ty), input(&names[1]), output(&outs[0]), output(&outs[1])];
            for (ty, name) in tys.iter().zip(names.iter().chain(outs.iter())) {
                let Some(ty) = ty else { return Err(bad(format!("the model has no `{name}`"))) };
                let (rank, d) = (ty.shape.rank(), &ty.shape.0);
                let heads = d.get(1).and_then(|d| d.as_static());
                let head_dim = d.get(3).and_then(|d| d.as_static());
                let (Some(h), Some(hd)) = (heads, head_dim) else {
                    return Err(bad(format!("`{name}` must be [1,heads,P,head_dim] with static heads, got {ty}")));
                };
                if rank != 4 || !ty.dtype.is_float() {
                    return Err(bad(format!("`{name}` must be a float [1,heads,P,head_dim] tensor, got {ty}")));
                }
                let here = (h as usize, hd as usize, ty.dtype);
                if *dims.get_or_insert(here) != here {
                    return Err(bad(format!("`{name}` is {ty}, unlike the other key/value tensors")));
                }
            }
            past.push(names);
            present.push(outs);
        }
        let Some((heads, head_dim, dtype)) = dims else {
            return Err(bad("the model has no `past_key_values.0.key` input; not a decoder step model".into()));
        };
        let vocab = match output("logits") {
            Some(t) if t.dtype == DType::F32 && t.shape.rank() == 3 => {
                t.shape.0[2].as_static().ok_or_else(|| bad(format!("`logits` needs a static vocabulary, got {t}")))?
            }
            Some(t) => return Err(bad(format!("`logits` must be f32 [1,S,vocab], the model has {t}"))),
            None => return Err(bad("the model has no `logits` output".into())),
        };
        let spec = DecoderSpec {
            input_ids: "input_ids".into(),
            position_ids: "position_ids".into(),
            attention_mask: "attention_mask".into(),
            past,
            present,
            logits: "logits".into(),
            heads,
            head_dim,
            vocab: vocab as usize,
            dtype,
            max_positions: None,
        };
        let known = |n: &str| {
            n == spec.input_ids
                || n == spec.position_ids
                || n == spec.attention_mask
                || spec.past.iter().flatten().any(|p| p == n)
        };
        if let Some((extra, _)) = inputs.iter().find(|(n, _)| !known(n)) {
            return Err(bad(format!("the model has an input `{extra}` a decoder step does not feed")));
        }
        Ok(spec)
    }
}

/// The key/value cache of a token prefix: per layer, keys and values `[1, heads, tokens, head_dim]`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvState {
    fingerprint: u64,
    tokens: Vec<Token>,
    layers: Vec<[Tensor; 2]>,
}

impl KvState {
    /// A state for `tokens` computed by the model with `fingerprint`; checks the module invariant (shapes agree
    /// with the token count, one dtype throughout, at least one layer).
    pub fn new(fingerprint: u64, tokens: Vec<Token>, layers: Vec<[Tensor; 2]>) -> Result<KvState, RunError> {
        let Some(first) = layers.first() else { return Err(RunError::State("a key/value state needs a layer".into())) };
        let (h, d, dtype) = match first[0].shape() {
            &[1, h, _, d] => (h, d, first[0].dtype()),
            s => {
                return Err(RunError::State(format!("key/value tensors must be [1,heads,tokens,head_dim], got {s:?}")));
            }
        };
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
            return Err(RunError::State(format!("key/value tensors must be floats, got {dtype}")));
        }
        for (i, t) in layers.iter().flatten().enumerate() {
            if t.shape() != [1, h, tokens.len(), d] || t.dtype() != dtype {
                return Err(RunError::State(format!(
                    "key/value tensor {i} is {} {:?}, expected {dtype} [1,{h},{},{d}]",
                    t.dtype(),
                    t.shape(),
                    tokens.len()
                )));
            }
        }
        Ok(KvState { fingerprint, tokens, layers })
    }

    /// The fingerprint of the model that computed the state.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The tokens the state covers, in order.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Per layer, the key and value tensors.
    pub fn layers(&self) -> &[[Tensor; 2]] {
        &self.layers
    }

    /// Attention heads.
    pub fn heads(&self) -> usize {
        self.layers[0][0].shape()[1]
    }

    /// Elements per head.
    pub fn head_dim(&self) -> usize {
        self.layers[0][0].shape()[3]
    }

    /// The key/value dtype.
    pub fn dtype(&self) -> DType {
        self.layers[0][0].dtype()
    }

    /// Whether the state was computed by the model `spec` describes, with the given fingerprint; `Err` says how
    /// it differs.
    pub fn check_fits(&self, spec: &DecoderSpec, fingerprint: u64) -> Result<(), RunError> {
        if self.fingerprint != fingerprint {
            return Err(RunError::State(format!(
                "the state was computed by a different model (fingerprint {:016x}, this model {fingerprint:016x})",
                self.fingerprint
            )));
        }
        let got = (self.layers.len(), self.heads(), self.head_dim(), self.dtype());
        let want = (spec.layers(), spec.heads, spec.head_dim, spec.dtype);
        if got != want {
            return Err(RunError::State(format!(
                "the state has {} layers x {} heads x {} head_dim of {}, the model {} x {} x {} of {}",
                got.0, got.1, got.2, got.3, want.0, want.1, want.2, want.3
            )));
        }
        if let Some(&t) = self.tokens.iter().find(|&&t| t as usize >= spec.vocab) {
            return Err(RunError::State(format!("the state holds token {t}, beyond the vocabulary of {}", spec.vocab)));
        }
        Ok(())
    }

    /// The state of the first `k` positions (a copy); `k` beyond the state's length is clamped to it.
    pub fn truncated(&self, k: usize) -> KvState {
        let k = k.min(self.tokens.len());
        let n = self.tokens.len();
        let layers = self.layers.iter().map(|pair| pair.clone().map(|t| keep_positions(&t, n, k))).collect();
        KvState { fingerprint: self.fingerprint, tokens: self.tokens[..k].to_vec(), layers }
    }

    /// Consumes the state, returning its per-layer tensors.
    pub fn into_layers(self) -> Vec<[Tensor; 2]> {
        self.layers
    }
}

/// The first `k` of `n` positions of a `[1, heads, n, head_dim]` tensor.
fn keep_positions(t: &Tensor, n: usize, k: usize) -> Tensor {
    if k == n {
        return t.clone();
    }
    let (h, d) = (t.shape()[1], t.shape()[3]);
    let row = d * t.dtype().size_bytes();
    let bytes = t.as_bytes();
    let mut out = Vec::with_capacity(h * k * row);
    for head in 0..h {
        let start = head * n * row;
        out.extend_from_slice(&bytes[start..start + k * row]);
    }
    Tensor::from_bytes(t.dtype(), vec![1, h, k, d], &out).expect("keep_positions: byte count matches the shape")
}

impl StateHandle for KvState {
    fn bytes(&self) -> u64 {
        let tensors: usize = self.layers.iter().flatten().map(|t| t.as_bytes().len()).sum();
        (tensors + self.tokens.len() * std::mem::size_of::<Token>()) as u64
    }

    fn tokens(&self) -> usize {
        self.tokens.len()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl CachedState for KvState {
    fn bytes(&self) -> u64 {
        StateHandle::bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(h: usize, n: usize, d: usize, base: f32) -> Tensor {
        Tensor::from_vec(vec![1, h, n, d], (0..h * n * d).map(|i| base + i as f32).collect()).unwrap()
    }

    #[test]
    fn truncation_keeps_the_first_positions_of_every_head() {
        let s = KvState::new(7, vec![1, 2, 3], vec![[tensor(2, 3, 2, 0.0), tensor(2, 3, 2, 100.0)]]).unwrap();
        let t = s.truncated(2);
        assert_eq!(t.tokens(), &[1, 2]);
        let k = t.layers()[0][0].as_slice::<f32>().unwrap();
        // head 0 positions 0,1 then head 1 positions 0,1 (head 1 starts at element 6)
        assert_eq!(k, &[0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0]);
        assert_eq!(t.layers()[0][1].as_slice::<f32>().unwrap()[4], 106.0);
        assert_eq!(s.truncated(9), s);
        assert_eq!(StateHandle::bytes(&t), (2 * 8 * 4 + 2 * 4) as u64);
    }

    #[test]
    fn inconsistent_states_are_rejected() {
        let e = KvState::new(7, vec![1, 2], vec![[tensor(2, 3, 2, 0.0), tensor(2, 3, 2, 0.0)]]).unwrap_err();
        assert!(e.to_string().contains("expected f32 [1,2,2,2]"), "{e}");
        assert!(KvState::new(7, vec![], vec![]).is_err());
    }
}

//! The token backend: greedy autoregressive decoding over a decoder step model, resuming from a key/value state.
//!
//! [`Decoder`] owns the decode loop and the state bookkeeping; *how* one step runs is a [`StepRunner`]'s business
//! (the `kiln` facade runs compiled programs specialized per shape; tests use a toy model in Rust). For a prompt
//! `t[0..n]`, a prefix state for tokens `s`, and `N` tokens to generate:
//!
//! 1. keep the state's first `k` positions, where `k` is the length of the longest common prefix of `s` and the
//!    prompt, capped at `n - 1` so that at least one prompt token is fed (its logits pick the first new token);
//! 2. prefill: one step feeding `t[k..n]` at positions `k..n` on top of those `k` positions;
//! 3. pick the next token greedily (the largest logit of the last position; ties go to the lowest id; NaN is an
//!    error), and for each further token feed the previous pick as a one-token step.
//!
//! That is `N` steps for `N ≥ 1` (one prefill and `N - 1` one-token steps; `N = 0` still prefills). The resulting
//! state covers the prompt and every generated token but the last one, which was picked but never fed: it holds
//! `n + N - 1` positions (`n` when `N = 0`). The outputs are the generated ids (i64 `[N]`) and, row `i` for
//! generated token `i`, the logits it was picked from (f32 `[N, vocab]`).

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_ir::{DType, Tensor};

use super::format;
use super::kv::{DecoderSpec, KvState};
use crate::RunError;
use crate::contract::{Backend, BackendState, Capabilities, Counters, Node, NodeKind, OpSupport, RunResult};
use crate::prefix_cache::Token;

/// The extents of one decoder step: `past` positions already in the key/value state, `new` tokens fed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepShape {
    /// Positions in the past key/value tensors (P).
    pub past: usize,
    /// Tokens fed in this step (S).
    pub new: usize,
}

/// Runs one step of a decoder step model: given the step's shape and its inputs by name (as [`DecoderSpec`]
/// names them), returns the model's outputs by name.
pub trait StepRunner: Send + Sync {
    /// Runs the step.
    fn run_step(&self, shape: StepShape, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError>;

    /// The tensor backend the steps run on (`cpu`), or empty.
    fn tensor_backend_type(&self) -> &str {
        ""
    }
}

/// What [`Decoder::decode`] produced.
#[derive(Clone, Debug)]
pub struct Decoded {
    /// The generated token ids.
    pub ids: Vec<Token>,
    /// Row `i`: the logits `ids[i]` was picked from; f32 `[ids.len(), vocab]`.
    pub logits: Tensor,
    /// The state after the run: the prompt and every generated token but the last.
    pub state: KvState,
    /// What the run cost and saved.
    pub counters: Counters,
}

/// The token backend (see the module docs): capabilities token, cache and state export.
pub struct Decoder {
    model: String,
    fingerprint: u64,
    spec: DecoderSpec,
    runner: Arc<dyn StepRunner>,
}

impl Decoder {
    /// A decoder for the model named `model` (what token nodes name), whose identity is `fingerprint` (states
    /// of other fingerprints are refused), shaped as `spec`, running steps with `runner`. A spec without layers,
    /// heads, head size or vocabulary, with unpaired past/present names or a non-float dtype is an error.
    pub fn new(
        model: impl Into<String>,
        fingerprint: u64,
        spec: DecoderSpec,
        runner: Arc<dyn StepRunner>,
    ) -> Result<Decoder, RunError> {
        let model = model.into();
        let problem = if spec.past.is_empty() || spec.past.len() != spec.present.len() {
            Some(format!("{} past and {} present key/value pairs", spec.past.len(), spec.present.len()))
        } else if spec.heads == 0 || spec.head_dim == 0 || spec.vocab == 0 {
            Some(format!("heads {}, head_dim {}, vocab {}", spec.heads, spec.head_dim, spec.vocab))
        } else if !spec.dtype.is_float() {
            Some(format!("key/value dtype {}", spec.dtype))
        } else {
            None
        };
        if let Some(p) = problem {
            return Err(RunError::Unsupported { node: model, reason: format!("not a usable decoder spec: {p}") });
        }
        Ok(Decoder { model, fingerprint, spec, runner })
    }

    /// The model's name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The model's fingerprint.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The step model's shape.
    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    /// Greedy decoding of `remaining` tokens after `prompt`, resuming from `prefix` where it agrees with the
    /// prompt (see the module docs).
    pub fn decode(&self, prompt: &[Token], prefix: Option<&KvState>, remaining: u32) -> Result<Decoded, RunError> {
        if prompt.is_empty() {
            return Err(RunError::Input("the prompt is empty: decoding needs at least one prompt token".into()));
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= self.spec.vocab) {
            return Err(RunError::Input(format!("token id {t} is beyond the vocabulary of {}", self.spec.vocab)));
        }
        let positions = prompt.len() + (remaining as usize).saturating_sub(1);
        if let Some(max) = self.spec.max_positions
            && positions > max
        {
            return Err(RunError::Input(format!(
                "{} prompt tokens and {remaining} new ones need {positions} positions; the model has {max}",
                prompt.len()
            )));
        }
        let mut past = match prefix {
            Some(state) => {
                state.check_fits(&self.spec, self.fingerprint)?;
                let shared = state.tokens().iter().zip(prompt).take_while(|(a, b)| a == b).count();
                state.truncated(shared.min(prompt.len() - 1))
            }
            None => self.empty_state(),
        };
        let reused = past.tokens().len();
        let mut counters = Counters {
            reused_prefix_len: reused as u32,
            tokens_saved: reused as u32,
            used_cached_state: reused > 0,
            ..Counters::default()
        };
        // Reserve for a modest count only: `remaining` is caller input, and may be huge when positions are not
        // bounded by the spec.
        let reserve = (remaining as usize).min(1024);
        let mut ids = Vec::with_capacity(reserve);
        let mut rows: Vec<f32> = Vec::with_capacity(reserve * self.spec.vocab);
        let mut feed: Vec<Token> = prompt[reused..].to_vec();
        loop {
            let last = self.step(&mut past, &feed)?;
            counters.compute_steps += 1;
            counters.tokens_sent += feed.len() as u32;
            if ids.len() == remaining as usize {
                break;
            }
            let next = argmax(&last).ok_or_else(|| {
                RunError::Op(format!("the logits for generated token {} hold NaN; no token can be picked", ids.len()))
            })?;
            ids.push(next);
            rows.extend_from_slice(&last);
            if ids.len() == remaining as usize {
                break;
            }
            feed = vec![next];
        }
        let logits = Tensor::from_vec(vec![ids.len(), self.spec.vocab], rows).expect("one logits row per generated id");
        Ok(Decoded { ids, logits, state: past, counters })
    }

    /// A state of zero positions.
    fn empty_state(&self) -> KvState {
        let empty = || Tensor::zeros(self.spec.dtype, vec![1, self.spec.heads, 0, self.spec.head_dim]);
        let layers = (0..self.spec.layers()).map(|_| [empty(), empty()]).collect();
        KvState::new(self.fingerprint, Vec::new(), layers).expect("an empty state of the spec's shape")
    }

    /// Feeds `tokens` on top of `past` (replaced by the state including them) and returns the logits of the last
    /// fed position.
    fn step(&self, past: &mut KvState, tokens: &[Token]) -> Result<Vec<f32>, RunError> {
        let spec = &self.spec;
        let (p, s) = (past.tokens().len(), tokens.len());
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let positions: Vec<i64> = (p..p + s).map(|i| i as i64).collect();
        let mut inputs = BTreeMap::new();
        let i64s = |v: Vec<i64>| Tensor::from_vec(vec![1, v.len()], v).expect("a [1,n] vector");
        inputs.insert(spec.input_ids.clone(), i64s(ids));
        inputs.insert(spec.position_ids.clone(), i64s(positions));
        inputs.insert(spec.attention_mask.clone(), i64s(vec![1; p + s]));
        let mut tokens_after = past.tokens().to_vec();
        tokens_after.extend_from_slice(tokens);
        let old = std::mem::replace(past, self.empty_state());
        for (names, pair) in spec.past.iter().zip(old.into_layers()) {
            let [k, v] = pair;
            inputs.insert(names[0].clone(), k);
            inputs.insert(names[1].clone(), v);
        }
        let mut outputs: BTreeMap<String, Tensor> =
            self.runner.run_step(StepShape { past: p, new: s }, &inputs)?.into_iter().collect();
        drop(inputs);
        let mut take = |name: &str, shape: &[usize], dtype: DType| -> Result<Tensor, RunError> {
            let t = outputs.remove(name).ok_or_else(|| {
                RunError::Backend(format!("the step model returned no `{name}` for step past {p}, new {s}"))
            })?;
            if t.shape() != shape || t.dtype() != dtype {
                return Err(RunError::Backend(format!(
                    "the step model's `{name}` is {} {:?}, expected {dtype} {shape:?}",
                    t.dtype(),
                    t.shape()
                )));
            }
            Ok(t)
        };
        let logits = take(&spec.logits, &[1, s, spec.vocab], DType::F32)?;
        let kv_shape = [1, spec.heads, p + s, spec.head_dim];
        let mut layers = Vec::with_capacity(spec.layers());
        for names in &spec.present {
            layers.push([take(&names[0], &kv_shape, spec.dtype)?, take(&names[1], &kv_shape, spec.dtype)?]);
        }
        *past = KvState::new(self.fingerprint, tokens_after, layers)?;
        let all = logits.as_slice::<f32>().expect("checked f32 above");
        Ok(all[(s - 1) * spec.vocab..].to_vec())
    }

    fn token_prompt(&self, node: &Node, inputs: &[Tensor]) -> Result<Vec<Token>, RunError> {
        let unsupported = |reason: String| RunError::Unsupported { node: node.name.clone(), reason };
        match &node.kind {
            NodeKind::Token { model, .. } if *model == self.model => {}
            NodeKind::Token { model, .. } => {
                return Err(unsupported(format!("this decoder runs model `{}`, not `{model}`", self.model)));
            }
            NodeKind::Op(op) => {
                return Err(unsupported(format!("op `{}`: the decoder runs token nodes only", op.mnemonic())));
            }
        }
        let [prompt] = inputs else {
            return Err(RunError::Input(format!(
                "a token node takes one input (the prompt ids), got {}",
                inputs.len()
            )));
        };
        let flat = matches!(prompt.shape(), [_]) || matches!(prompt.shape(), [1, _]);
        if prompt.dtype() != DType::I64 || !flat {
            return Err(RunError::Input(format!(
                "the prompt must be i64 [n] or [1,n] token ids, got {} {:?}",
                prompt.dtype(),
                prompt.shape()
            )));
        }
        prompt
            .to_i64_vec()
            .into_iter()
            .map(|t| Token::try_from(t).map_err(|_| RunError::Input(format!("token id {t} is not a valid id"))))
            .collect()
    }
}

/// The index of the largest value, the lowest index among equals; `None` for an empty row or one holding NaN.
pub fn argmax(row: &[f32]) -> Option<Token> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in row.iter().enumerate() {
        if x.is_nan() {
            return None;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i as Token)
}

impl Backend for Decoder {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            token: true,
            cache: true,
            state_export: true,
            ops: OpSupport::Only(vec![]),
            ..Capabilities::none()
        }
    }

    fn tensor_backend_type(&self) -> &str {
        self.runner.tensor_backend_type()
    }

    fn export_state(&self, state: &BackendState) -> Option<Vec<u8>> {
        state.downcast::<KvState>().map(format::encode)
    }

    fn import_state(&self, bytes: &[u8]) -> Result<BackendState, RunError> {
        format::decode(bytes, &self.spec, self.fingerprint).map(BackendState::new)
    }

    fn run_with_cache(
        &self,
        node: &Node,
        inputs: &[Tensor],
        prefix_state: Option<&BackendState>,
        _remaining_tokens: u32,
    ) -> Result<RunResult, RunError> {
        // The decoder finds the shared prefix itself (it compares the state's tokens with the prompt), so the
        // caller's count of uncached tokens is not needed; the generation length is the node's.
        let prompt = self.token_prompt(node, inputs)?;
        let max_new_tokens = match &node.kind {
            crate::contract::NodeKind::Token { max_new_tokens, .. } => *max_new_tokens,
            crate::contract::NodeKind::Op(_) => 0,
        };
        let prefix = match prefix_state {
            Some(s) => Some(s.downcast::<KvState>().ok_or_else(|| {
                RunError::State(format!(
                    "node `{}`: the prefix state is not a key/value state of this decoder",
                    node.name
                ))
            })?),
            None => None,
        };
        let d = self.decode(&prompt, prefix, max_new_tokens)?;
        let ids = Tensor::from_vec(vec![d.ids.len()], d.ids.iter().map(|&t| t as i64).collect()).expect("[n] ids");
        Ok(RunResult { outputs: vec![ids, d.logits], state: Some(BackendState::new(d.state)), counters: d.counters })
    }
}

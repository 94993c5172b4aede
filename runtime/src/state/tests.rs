//! The decoder and the session against a toy step model written in Rust: the decode loop, prefix reuse, the
//! counters and state export are tested here without any compiled model.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kiln_ir::{DType, Tensor};

use super::*;
use crate::RunError;
use crate::contract::{Backend, BackendState, Capabilities, Node, RunResult};

const HEADS: usize = 2;
const DIM: usize = 2;
const VOCAB: usize = 23;
const LAYERS: usize = 2;

fn spec() -> DecoderSpec {
    DecoderSpec {
        input_ids: "input_ids".into(),
        position_ids: "position_ids".into(),
        attention_mask: "attention_mask".into(),
        past: (0..LAYERS).map(|l| [format!("past_key_values.{l}.key"), format!("past_key_values.{l}.value")]).collect(),
        present: (0..LAYERS).map(|l| [format!("present.{l}.key"), format!("present.{l}.value")]).collect(),
        logits: "logits".into(),
        heads: HEADS,
        head_dim: DIM,
        vocab: VOCAB,
        dtype: DType::F32,
        max_positions: Some(64),
    }
}

/// The key/value entry a toy layer stores for token `t` at position `p`.
fn entry(layer: usize, kind: usize, t: u32, p: usize, h: usize, d: usize) -> f32 {
    ((t as usize * 31 + p * 7 + h * 3 + d + layer * 5 + kind * 11) % 97) as f32 / 97.0
}

/// The toy logits at the last of `keys.len()` positions: every vocabulary entry weighs every cached key of the
/// last layer, so a logit depends on the whole prefix and its positions.
fn logits_from(keys: &[f32]) -> Vec<f32> {
    (0..VOCAB)
        .map(|v| keys.iter().enumerate().map(|(j, k)| k * (((v * 13 + j * 5) % 7) as f32 - 3.0)).sum::<f32>())
        .collect()
}

/// A deterministic toy decoder step: checks its inputs like a compiled model would, appends the new positions'
/// keys and values, and records each step's shape.
#[derive(Default)]
struct Toy {
    calls: Mutex<Vec<StepShape>>,
}

impl StepRunner for Toy {
    fn run_step(&self, shape: StepShape, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        self.calls.lock().unwrap().push(shape);
        let (p, s) = (shape.past, shape.new);
        let get = |n: &str| inputs.get(n).ok_or_else(|| RunError::Input(format!("missing {n}")));
        let ids = get("input_ids")?.to_i64_vec();
        let pos = get("position_ids")?.to_i64_vec();
        if ids.len() != s || pos != (p as i64..(p + s) as i64).collect::<Vec<_>>() {
            return Err(RunError::Input(format!("bad ids {ids:?} / positions {pos:?} for {shape:?}")));
        }
        if get("attention_mask")?.to_i64_vec() != vec![1; p + s] {
            return Err(RunError::Input("bad attention mask".into()));
        }
        let mut out = Vec::new();
        let mut last_keys = Vec::new();
        for l in 0..LAYERS {
            for (kind, what) in ["key", "value"].iter().enumerate() {
                let past = get(&format!("past_key_values.{l}.{what}"))?;
                if past.shape() != [1, HEADS, p, DIM] {
                    return Err(RunError::Input(format!("past {l}.{what} is {:?}", past.shape())));
                }
                let past = past.as_slice::<f32>().unwrap();
                let mut present = Vec::new();
                for h in 0..HEADS {
                    present.extend_from_slice(&past[h * p * DIM..(h + 1) * p * DIM]);
                    for (i, &t) in ids.iter().enumerate() {
                        present.extend((0..DIM).map(|d| entry(l, kind, t as u32, p + i, h, d)));
                    }
                }
                if l == LAYERS - 1 && kind == 0 {
                    last_keys = present.clone();
                }
                out.push((
                    format!("present.{l}.{what}"),
                    Tensor::from_vec(vec![1, HEADS, p + s, DIM], present).unwrap(),
                ));
            }
        }
        // Logits of new position i see positions 0..=p+i of head 0, element 0.
        let head0: Vec<f32> = (0..p + s).map(|j| last_keys[j * DIM]).collect();
        let logits: Vec<f32> = (0..s).flat_map(|i| logits_from(&head0[..=p + i])).collect();
        out.insert(0, ("logits".into(), Tensor::from_vec(vec![1, s, VOCAB], logits).unwrap()));
        Ok(out)
    }

    fn tensor_backend_type(&self) -> &str {
        "cpu"
    }
}

/// Greedy decoding with the toy computed from scratch for every token: what the decoder must reproduce.
fn reference(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let keys: Vec<f32> = seq.iter().enumerate().map(|(p, &t)| entry(LAYERS - 1, 0, t, p, 0, 0)).collect();
        let next = argmax(&logits_from(&keys)).unwrap();
        out.push(next);
        seq.push(next);
    }
    out
}

fn decoder() -> (Decoder, Arc<Toy>) {
    let toy = Arc::new(Toy::default());
    (Decoder::new("toy", 99, spec(), toy.clone()).unwrap(), toy)
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7 + 3) % VOCAB) as u32).collect()
}

#[test]
fn cold_decoding_matches_the_reference_and_counts_steps() {
    let (dec, toy) = decoder();
    let p = prompt(10);
    let d = dec.decode(&p, None, 5).unwrap();
    assert_eq!(d.ids, reference(&p, 5));
    assert!(d.ids.windows(2).any(|w| w[0] != w[1]), "the toy must not be trivial: {:?}", d.ids);
    assert_eq!(d.logits.shape(), [5, VOCAB]);
    let c = d.counters;
    assert_eq!((c.reused_prefix_len, c.compute_steps, c.tokens_sent, c.tokens_saved), (0, 5, 14, 0));
    assert!(!c.used_cached_state);
    // The state covers the prompt and the first four generated tokens (the fifth was never fed).
    let mut covered = p.clone();
    covered.extend_from_slice(&d.ids[..4]);
    assert_eq!(d.state.tokens(), covered.as_slice());
    let shapes = toy.calls.lock().unwrap().clone();
    let want: Vec<StepShape> =
        [(0, 10), (10, 1), (11, 1), (12, 1), (13, 1)].iter().map(|&(past, new)| StepShape { past, new }).collect();
    assert_eq!(shapes, want);
}

#[test]
fn resuming_from_a_prefix_state_gives_the_same_tokens_and_logits() {
    let (dec, toy) = decoder();
    let first = prompt(12);
    let warm = dec.decode(&first, None, 0).unwrap();
    assert_eq!((warm.ids.len(), warm.state.tokens().len(), warm.counters.compute_steps), (0, 12, 1));
    // A second prompt sharing 8 tokens, then diverging.
    let mut second = first[..8].to_vec();
    second.extend([1, 2, 3, 4]);
    let cold = dec.decode(&second, None, 6).unwrap();
    toy.calls.lock().unwrap().clear();
    let hot = dec.decode(&second, Some(&warm.state), 6).unwrap();
    assert_eq!(hot.ids, cold.ids);
    assert_eq!(hot.logits, cold.logits);
    assert_eq!(hot.state, cold.state);
    let c = hot.counters;
    assert_eq!((c.reused_prefix_len, c.tokens_saved, c.compute_steps, c.tokens_sent), (8, 8, 6, 4 + 5));
    assert!(c.used_cached_state);
    assert_eq!(toy.calls.lock().unwrap()[0], StepShape { past: 8, new: 4 });
}

#[test]
fn a_fully_cached_prompt_still_feeds_its_last_token() {
    let (dec, _) = decoder();
    let p = prompt(9);
    let warm = dec.decode(&p, None, 4).unwrap(); // state: 9 prompt + 3 generated tokens
    let again = dec.decode(&p, Some(&warm.state), 4).unwrap();
    assert_eq!(again.ids, warm.ids);
    assert_eq!((again.counters.reused_prefix_len, again.counters.tokens_sent), (8, 1 + 3));
    // A prompt that continues the state's tokens reuses all of them.
    let mut longer = warm.state.tokens().to_vec();
    longer.push(warm.ids[3]);
    let cont = dec.decode(&longer, Some(&warm.state), 3).unwrap();
    assert_eq!(cont.ids, reference(&longer, 3));
    assert_eq!((cont.counters.reused_prefix_len, cont.counters.tokens_sent), (12, 1 + 2));
    // No shared token: a cold start that says so.
    let other = dec.decode(&[22, 1], Some(&warm.state), 2).unwrap();
    assert_eq!((other.counters.reused_prefix_len, other.counters.used_cached_state), (0, false));
    assert_eq!(other.ids, reference(&[22, 1], 2));
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let (dec, _) = decoder();
    assert!(dec.decode(&[], None, 1).unwrap_err().to_string().contains("empty"));
    assert!(dec.decode(&[VOCAB as u32], None, 1).unwrap_err().to_string().contains("beyond the vocabulary"));
    assert!(dec.decode(&prompt(60), None, 10).unwrap_err().to_string().contains("positions"));
    let stranger = Decoder::new("toy", 100, spec(), Arc::new(Toy::default())).unwrap();
    let state = stranger.decode(&prompt(3), None, 0).unwrap().state;
    assert!(dec.decode(&prompt(3), Some(&state), 1).unwrap_err().to_string().contains("different model"));
    let node = Node::token("n", "toy", true, 1);
    let ids = |v: Vec<i64>| Tensor::from_vec(vec![v.len()], v).unwrap();
    assert!(matches!(
        dec.run_with_cache(&Node::token("n", "other", false, 1), &[ids(vec![1])], None, 1),
        Err(RunError::Unsupported { .. })
    ));
    assert!(dec.run_with_cache(&node, &[], None, 1).is_err());
    assert!(dec.run_with_cache(&node, &[ids(vec![-1])], None, 1).unwrap_err().to_string().contains("not a valid id"));
    let floats = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
    assert!(dec.run_with_cache(&node, &[floats], None, 1).unwrap_err().to_string().contains("must be i64"));
    let foreign = BackendState::new(Unrelated);
    let e = dec.run_with_cache(&node, &[ids(vec![1, 2])], Some(&foreign), 1).unwrap_err();
    assert!(matches!(e, RunError::State(_)), "{e}");
    // A step runner returning the wrong shape is a backend error.
    let broken = Decoder::new("toy", 99, DecoderSpec { heads: 3, ..spec() }, Arc::new(Toy::default())).unwrap();
    assert!(matches!(broken.decode(&prompt(2), None, 1), Err(RunError::Input(_) | RunError::Backend(_))));
}

#[test]
fn unusable_specs_are_refused() {
    let toy = || -> Arc<dyn StepRunner> { Arc::new(Toy::default()) };
    for bad in [
        DecoderSpec { past: vec![], present: vec![], ..spec() },
        DecoderSpec { present: vec![], ..spec() },
        DecoderSpec { heads: 0, ..spec() },
        DecoderSpec { vocab: 0, ..spec() },
        DecoderSpec { dtype: DType::I64, ..spec() },
    ] {
        let e = Decoder::new("toy", 1, bad, toy()).err().expect("refused");
        assert!(e.to_string().contains("not a usable decoder spec"), "{e}");
    }
}

struct Unrelated;
impl crate::contract::StateHandle for Unrelated {
    fn bytes(&self) -> u64 {
        0
    }
    fn tokens(&self) -> usize {
        0
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn argmax_picks_the_lowest_id_among_ties_and_refuses_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
    assert_eq!(argmax(&[-1.0, -1.0]), Some(0));
    assert_eq!(argmax(&[1.0, f32::NAN]), None);
    assert_eq!(argmax(&[]), None);
}

#[test]
fn the_backend_contract_round_trips_states_through_bytes() {
    let (dec, _) = decoder();
    assert!(dec.capabilities().token && dec.capabilities().cache && dec.capabilities().state_export);
    assert_eq!(dec.tensor_backend_type(), "cpu");
    let node = Node::token("n", "toy", true, 3);
    let p: Vec<i64> = prompt(7).iter().map(|&t| t as i64).collect();
    let first = dec.run_with_cache(&node, &[Tensor::from_vec(vec![7], p.clone()).unwrap()], None, 7).unwrap();
    let state = first.state.unwrap();
    let bytes = dec.export_state(&state).unwrap();
    let imported = dec.import_state(&bytes).unwrap();
    assert_eq!(imported.downcast::<KvState>(), state.downcast::<KvState>());
    assert!(dec.export_state(&BackendState::new(Unrelated)).is_none());
    assert!(matches!(dec.import_state(&bytes[..bytes.len() / 2]), Err(RunError::State(_))));
    // Continuing from the imported state equals a cold run of the longer prompt.
    let mut longer = p.clone();
    longer.extend(first.outputs[0].to_i64_vec());
    let t = Tensor::from_vec(vec![longer.len()], longer).unwrap();
    // Four tokens to generate; the prompt's tokens past the imported state's are the uncached ones.
    let node = Node::token("n", "toy", true, 4);
    let uncached = (t.shape()[0] - imported.tokens()) as u32;
    let hot = dec.run_with_cache(&node, std::slice::from_ref(&t), Some(&imported), uncached).unwrap();
    let cold = dec.run_with_cache(&node, &[t], None, 10).unwrap();
    assert_eq!(hot.outputs, cold.outputs);
    assert_eq!(hot.counters.reused_prefix_len, 9);
}

#[test]
fn a_session_reuses_the_longest_cached_prefix() {
    let (dec, toy) = decoder();
    let mut session = TokenSession::new(Arc::new(dec), "toy", 1 << 20).unwrap();
    let long = prompt(32);
    let first = session.generate(&long[..24], 4).unwrap();
    assert_eq!(first.counters.reused_prefix_len, 0);
    assert_eq!(first.ids, reference(&long[..24], 4));
    let second = session.generate(&long, 4).unwrap();
    assert_eq!(second.ids, reference(&long, 4));
    assert_eq!(second.counters.reused_prefix_len, 24);
    assert_eq!(second.counters.tokens_sent, 8 + 3);
    assert_eq!(session.cache_stats().entries, 2);
    // The same prompt again: everything but its last token is cached.
    let third = session.generate(&long, 4).unwrap();
    assert_eq!((third.ids, third.counters.reused_prefix_len), (second.ids, 31));
    assert!(toy.calls.lock().unwrap().contains(&StepShape { past: 31, new: 1 }));
}

#[test]
fn a_session_within_a_tiny_budget_runs_cold_but_right() {
    let (dec, _) = decoder();
    let mut session = TokenSession::new(Arc::new(dec), "toy", 16).unwrap();
    let p = prompt(20);
    let a = session.generate(&p, 3).unwrap();
    let b = session.generate(&p, 3).unwrap();
    assert_eq!(a.ids, b.ids);
    assert_eq!(b.counters.reused_prefix_len, 0, "no state fits in 16 bytes");
    assert_eq!(session.cache_stats().entries, 0);
}

/// The toy decoder behind a backend that cannot externalize its states (the contract's default export/import).
struct NotPortable(Decoder);

impl Backend for NotPortable {
    fn capabilities(&self) -> Capabilities {
        Capabilities { state_export: false, ..self.0.capabilities() }
    }

    fn run_with_cache(
        &self,
        node: &Node,
        inputs: &[Tensor],
        prefix_state: Option<&BackendState>,
        remaining_tokens: u32,
    ) -> Result<RunResult, RunError> {
        self.0.run_with_cache(node, inputs, prefix_state, remaining_tokens)
    }
}

#[test]
fn a_session_checkpoint_resumes_in_a_new_session() {
    let (dec, _) = decoder();
    let mut session = TokenSession::new(Arc::new(dec), "toy", 1 << 20).unwrap();
    let long = prompt(32);
    session.generate(&long[..24], 4).unwrap();
    session.generate(&prompt(12), 2).unwrap();
    let checkpoint = session.checkpoint();
    assert_eq!((checkpoint.states.len(), checkpoint.dropped), (2, 0));

    let (fresh, toy) = decoder();
    let mut resumed = TokenSession::new(Arc::new(fresh), "toy", 1 << 20).unwrap();
    let report = resumed.restore(&checkpoint);
    assert_eq!(report, RestoreReport { restored: 2, refused: vec![] });
    let g = resumed.generate(&long, 4).unwrap();
    assert_eq!(g.ids, reference(&long, 4));
    assert_eq!(g.counters.reused_prefix_len, 24);
    assert!(g.counters.used_cached_state);
    assert_eq!(toy.calls.lock().unwrap()[0], StepShape { past: 24, new: 8 });
}

#[test]
fn a_backend_without_portable_states_drops_them_and_resumes_cold() {
    let (dec, _) = decoder();
    let mut session = TokenSession::new(Arc::new(NotPortable(dec)), "toy", 1 << 20).unwrap();
    let long = prompt(32);
    session.generate(&long[..24], 4).unwrap();
    let checkpoint = session.checkpoint();
    assert!(checkpoint.states.is_empty());
    assert_eq!(checkpoint.dropped, 1);

    let (fresh, _) = decoder();
    let mut resumed = TokenSession::new(Arc::new(NotPortable(fresh)), "toy", 1 << 20).unwrap();
    assert_eq!(resumed.restore(&checkpoint), RestoreReport::default());
    let g = resumed.generate(&long, 4).unwrap();
    assert_eq!(g.ids, reference(&long, 4));
    assert_eq!((g.counters.reused_prefix_len, g.counters.used_cached_state), (0, false), "a cold start");
}

#[test]
fn refused_checkpoint_states_are_reported_and_skipped() {
    let (dec, _) = decoder();
    let mut session = TokenSession::new(Arc::new(dec), "toy", 1 << 20).unwrap();
    let long = prompt(32);
    session.generate(&long[..24], 4).unwrap();
    let mut checkpoint = session.checkpoint();
    let good = checkpoint.states[0].clone();
    let mut corrupt = good.clone();
    let last = corrupt.1.len() - 1;
    corrupt.1[last] ^= 0x40;
    let mut wrong_tokens = good.clone();
    wrong_tokens.0.pop();
    checkpoint.states = vec![corrupt, wrong_tokens];

    let (fresh, _) = decoder();
    let mut resumed = TokenSession::new(Arc::new(fresh), "toy", 1 << 20).unwrap();
    let report = resumed.restore(&checkpoint);
    assert_eq!(report.restored, 0);
    assert_eq!(report.refused.len(), 2, "{:?}", report.refused);
    assert!(report.refused[1].contains("saved for"), "{:?}", report.refused);
    let g = resumed.generate(&long, 4).unwrap();
    assert_eq!((g.ids, g.counters.reused_prefix_len), (reference(&long, 4), 0));
}

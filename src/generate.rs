//! Greedy text generation with an ONNX decoder step model (`gpt2_small_step` and its kind), on the CPU.
//!
//! kiln cannot yet compile such a model with its past and new lengths symbolic (the importer needs `Range`
//! bounds and `Concat` extents at import time), so every step shape `(past P, new S)` is imported and compiled
//! on its own, from one parsed copy of the model, and kept in an LRU cache of compiled programs
//! ([`StepPrograms`]). That is a real cost — a prefill and `N` decode steps need `N + 1` programs — reported in
//! [`StepStats`].
//!
//! [`Generator`] ties it together: a [`kiln_runtime::state::Decoder`] over those programs, behind a
//! [`kiln_runtime::state::TokenSession`] that reuses the longest cached prefix across requests, and state
//! export/import for reuse across processes. `docs/generate.md` has the whole story.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_ir::Tensor;
use kiln_runtime::RunError;
use kiln_runtime::contract::{Backend as _, BackendState, Counters};
use kiln_runtime::prefix_cache::{CacheStats, Token};
use kiln_runtime::state::{Decoder, DecoderSpec, StepRunner, StepShape, TokenSession, format};

use crate::{CompileOptions, Compiled, Error, Model};

/// How to set up generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// How each step program is compiled (pipeline, threads).
    pub compile: CompileOptions,
    /// Compiled step programs kept (least recently used go first); at least 1.
    pub max_programs: usize,
    /// Bytes of key/value states the prefix cache keeps.
    pub cache_budget: u64,
    /// Which step shapes get a program of their own.
    pub step_shapes: StepShapes,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions {
            compile: CompileOptions::default(),
            max_programs: 8,
            cache_budget: 64 << 20,
            step_shapes: StepShapes::PowerOfTwo,
        }
    }
}

/// Which step shapes (P past positions, S new tokens) get a compiled program of their own.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum StepShapes {
    /// Every (P, S): one compile per decode step, since each step's past is one longer than the last.
    Exact,
    /// P rounded up to a power of two (at least [`MIN_PAST_BUCKET`]; P = 0 stays 0) and S to a power of two.
    /// The past is padded with zero keys and values that the attention mask hides; the new tokens are padded at
    /// the end with id 0, which the causal mask hides from the real ones; the padding is cut out of the outputs.
    /// A decode of N tokens then compiles O(log N) programs instead of N, and prompts of similar lengths share
    /// their prefill program. Where the padded shape would pass the model's positions, the exact extents are
    /// used. Valid for GPT-2 style step models (an attention mask over the keys, causal attention).
    #[default]
    PowerOfTwo,
}

/// The smallest padded past length of [`StepShapes::PowerOfTwo`].
pub const MIN_PAST_BUCKET: usize = 16;

/// What the step programs cost so far.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct StepStats {
    /// Step shapes imported and compiled.
    pub compiles: u64,
    /// Steps that found their program already compiled.
    pub reuses: u64,
    /// Programs dropped to stay within [`GenerateOptions::max_programs`].
    pub evicted: u64,
    /// Wall time importing and compiling.
    pub compile_time: Duration,
    /// The part of `compile_time` spent importing (specializing the ONNX model to the step's shape).
    pub import_time: Duration,
    /// Wall time running steps.
    pub run_time: Duration,
}

/// A decoder step model compiled per step shape on demand, with an LRU cache of programs: the
/// [`StepRunner`] behind [`Generator`].
pub struct StepPrograms {
    source: Source,
    /// The probe's weights, shared by every program.
    weights: kiln_ir::graph::Weights,
    fingerprint: u64,
    spec: DecoderSpec,
    compile: CompileOptions,
    max_programs: usize,
    step_shapes: StepShapes,
    cache: Mutex<ProgramCache>,
}

/// The parsed ONNX model, specialized per step shape.
struct Source {
    proto: onnx_protobuf::ModelProto,
    base_dir: PathBuf,
    shown: String,
}

#[derive(Default)]
struct ProgramCache {
    programs: HashMap<StepShape, (Arc<Compiled>, u64)>,
    clock: u64,
    stats: StepStats,
}

impl StepPrograms {
    /// Parses the ONNX file at `path` and derives its [`DecoderSpec`] from one import (one past position, one new
    /// token); programs are compiled when a step first needs them.
    pub fn open(path: &Path, options: &GenerateOptions) -> Result<StepPrograms, Error> {
        use protobuf::Message;
        let shown = path.display().to_string();
        let bytes =
            kiln_ir::io::read_file(path).map_err(|e| Error::Io { path: shown.clone(), message: e.to_string() })?;
        let fingerprint = format::fingerprint(&bytes);
        let proto = onnx_protobuf::ModelProto::parse_from_bytes(&bytes)
            .map_err(|e| Error::Format { path: shown.clone(), message: format!("not a valid ONNX model: {e}") })?;
        drop(bytes);
        let base_dir = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let source = Source { proto, base_dir, shown };
        // Any real shape shows the signature; programs are compiled only for the shapes steps use.
        let probe = source.specialize(StepShape { past: 1, new: 1 }, None)?;
        let weights = probe.graph().weights.clone();
        let outputs: Vec<(String, kiln_ir::TensorType)> = probe
            .graph()
            .outputs()
            .iter()
            .filter_map(|(n, v)| probe.graph().value_type(*v).map(|t| (n.clone(), t.clone())))
            .collect();
        let mut spec =
            DecoderSpec::from_signature(&probe.inputs(), &outputs).map_err(|e| source.format(e.to_string()))?;
        // GPT-2 names its position-embedding table `…wpe.weight`: its rows bound the positions a step may use.
        spec.max_positions = probe
            .graph()
            .weights
            .iter()
            .find(|(n, t)| n.ends_with("wpe.weight") && t.shape().len() == 2)
            .map(|(_, t)| t.shape()[0]);
        Ok(StepPrograms {
            source,
            weights,
            fingerprint,
            spec,
            compile: options.compile.clone(),
            max_programs: options.max_programs.max(1),
            step_shapes: options.step_shapes,
            cache: Mutex::new(ProgramCache::default()),
        })
    }

    /// The fingerprint of the model file's bytes ([`format::fingerprint`]).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The step model's names and sizes.
    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    /// The shape of the program that runs a step of `shape`: `shape` itself, or its bucket (see
    /// [`StepShapes`]).
    pub fn compiled_shape(&self, shape: StepShape) -> StepShape {
        match self.step_shapes {
            StepShapes::Exact => shape,
            StepShapes::PowerOfTwo => {
                let past = if shape.past == 0 { 0 } else { shape.past.next_power_of_two().max(MIN_PAST_BUCKET) };
                let new = shape.new.next_power_of_two();
                let fits = |c: &StepShape| self.spec.max_positions.is_none_or(|max| c.past + c.new <= max);
                [StepShape { past, new }, StepShape { past, new: shape.new }, StepShape { past: shape.past, new }]
                    .into_iter()
                    .find(fits)
                    .unwrap_or(shape)
            }
        }
    }

    /// What compiling and running steps cost so far.
    pub fn stats(&self) -> StepStats {
        self.lock().stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgramCache> {
        // A panic while holding the lock leaves a consistent cache (entries are inserted whole), so a poisoned
        // lock is still usable.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The compiled program for `shape`, compiling it on first use.
    fn program(&self, shape: StepShape) -> Result<Arc<Compiled>, Error> {
        let mut cache = self.lock();
        cache.clock += 1;
        let now = cache.clock;
        if let Some((program, used)) = cache.programs.get_mut(&shape) {
            *used = now;
            let program = Arc::clone(program);
            cache.stats.reuses += 1;
            return Ok(program);
        }
        let t0 = Instant::now();
        let model = self.source.specialize(shape, Some(&self.weights))?;
        cache.stats.import_time += t0.elapsed();
        let program = Arc::new(model.compile(&self.compile)?);
        cache.stats.compile_time += t0.elapsed();
        cache.stats.compiles += 1;
        while cache.programs.len() >= self.max_programs {
            let Some(oldest) = cache.programs.iter().min_by_key(|(k, (_, used))| (*used, **k)).map(|(k, _)| *k) else {
                break;
            };
            cache.programs.remove(&oldest);
            cache.stats.evicted += 1;
        }
        cache.programs.insert(shape, (Arc::clone(&program), now));
        Ok(program)
    }
}

impl Source {
    /// Static extents for every graph input at `shape`, by the GPT-2 step model's input names.
    fn shapes_for(&self, shape: StepShape) -> Result<BTreeMap<String, Vec<usize>>, Error> {
        let graph = self.proto.graph.as_ref().ok_or_else(|| self.format("the model has no graph".into()))?;
        let initializers: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
        let (p, s) = (shape.past, shape.new);
        let mut out = BTreeMap::new();
        for vi in graph.input.iter().filter(|i| !initializers.contains(i.name.as_str())) {
            let dims = match vi.name.as_str() {
                "input_ids" | "position_ids" => vec![1, s],
                "attention_mask" => vec![1, p + s],
                n if n.starts_with("past_key_values.") => {
                    let declared = declared_dims(vi);
                    match declared.as_slice() {
                        [_, Some(h), _, Some(d)] => vec![1, *h, p, *d],
                        _ => {
                            return Err(self.format(format!(
                                "input `{n}` must be declared [batch,heads,past,head_dim] with static heads and head_dim"
                            )));
                        }
                    }
                }
                n => return Err(self.format(format!("input `{n}` is not one a decoder step model takes"))),
            };
            out.insert(vi.name.clone(), dims);
        }
        Ok(out)
    }

    fn format(&self, message: String) -> Error {
        Error::Format { path: self.shown.clone(), message }
    }

    /// The model specialized to `shape`.
    /// The model specialized to `shape`. Weights equal to one in `shared` (by name and bytes) become that
    /// shared tensor, so the programs of all shapes hold one copy of the model's weights, not one each.
    fn specialize(&self, shape: StepShape, shared: Option<&kiln_ir::graph::Weights>) -> Result<Model, Error> {
        let options = kiln_onnx::ImportOptions { shapes: self.shapes_for(shape)?, ..Default::default() };
        let mut graph = kiln_onnx::import_model(&self.proto, Some(&self.base_dir), &options)
            .map_err(|e| Error::OnnxAt(e, self.shown.clone()))?;
        if let Some(shared) = shared {
            let same: Vec<(String, Arc<Tensor>)> = graph
                .weights
                .iter()
                .filter_map(|(name, t)| {
                    let s = shared.get(name)?;
                    let equal = s.dtype() == t.dtype() && s.shape() == t.shape() && s.as_bytes() == t.as_bytes();
                    equal.then(|| (name.to_string(), Arc::clone(s)))
                })
                .collect();
            for (name, t) in same {
                graph.weights.insert(name, t);
            }
        }
        Model::from_graph(graph)
    }
}

/// The declared extents of an ONNX graph input (`None` for a symbolic or unknown one).
fn declared_dims(vi: &onnx_protobuf::ValueInfoProto) -> Vec<Option<usize>> {
    use onnx_protobuf::tensor_shape_proto::dimension::Value as Dv;
    use onnx_protobuf::type_proto::Value as Tv;
    let Some(Tv::TensorType(tt)) = vi.type_.as_ref().and_then(|t| t.value.as_ref()) else { return Vec::new() };
    let Some(shape) = tt.shape.as_ref() else { return Vec::new() };
    shape
        .dim
        .iter()
        .map(|d| match d.value {
            Some(Dv::DimValue(n)) if n >= 0 => Some(n as usize),
            _ => None,
        })
        .collect()
}

/// A `[1, heads, plan.len(), head_dim]` tensor whose position `j` is position `plan[j]` of the
/// `[1, heads, from, head_dim]` tensor `t`, or zeros for `None`.
fn gather_positions(t: &Tensor, from: usize, plan: &[Option<usize>]) -> Result<Tensor, RunError> {
    let bad = || RunError::Backend(format!("key/value tensor {:?} is not [1,heads,{from},head_dim]", t.shape()));
    let &[1, heads, n, d] = t.shape() else { return Err(bad()) };
    if n != from || plan.iter().flatten().any(|&i| i >= from) {
        return Err(bad());
    }
    let row = d * t.dtype().size_bytes();
    let bytes = t.as_bytes();
    let mut out = vec![0u8; heads * plan.len() * row];
    for h in 0..heads {
        for (j, src) in plan.iter().enumerate() {
            if let Some(i) = src {
                let at = (h * plan.len() + j) * row;
                out[at..at + row].copy_from_slice(&bytes[(h * from + i) * row..(h * from + i + 1) * row]);
            }
        }
    }
    Tensor::from_bytes(t.dtype(), vec![1, heads, plan.len(), d], &out).ok_or_else(bad)
}

/// The first `rows` rows (axis 1) of a `[1, n, …]` tensor.
fn first_rows(t: &Tensor, rows: usize) -> Result<Tensor, RunError> {
    let bad = || RunError::Backend(format!("cannot take {rows} rows of a {:?} output", t.shape()));
    let shape = t.shape();
    if shape.len() < 2 || shape[0] != 1 || shape[1] < rows {
        return Err(bad());
    }
    let per_row: usize = shape[2..].iter().product::<usize>() * t.dtype().size_bytes();
    let mut dims = shape.to_vec();
    dims[1] = rows;
    Tensor::from_bytes(t.dtype(), dims, &t.as_bytes()[..rows * per_row]).ok_or_else(bad)
}

impl StepPrograms {
    fn run_program(
        &self,
        shape: StepShape,
        inputs: &BTreeMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let program = self.program(shape).map_err(|e| {
            RunError::Backend(format!("compiling the step for past {}, new {}: {e}", shape.past, shape.new))
        })?;
        let t0 = Instant::now();
        let out = program.run(inputs).map_err(|e| match e {
            Error::Input(m) => RunError::Input(m),
            e => RunError::Backend(e.to_string()),
        });
        self.lock().stats.run_time += t0.elapsed();
        out
    }
}

impl StepRunner for StepPrograms {
    fn run_step(&self, shape: StepShape, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        let compiled = self.compiled_shape(shape);
        if compiled == shape {
            return self.run_program(shape, inputs);
        }
        // The program's positions: the p real past ones, zeros up to pc (masked out), the s new tokens, then
        // pad tokens up to sc (after every real token, so causal attention hides them from the real ones).
        let (p, s, pc, sc) = (shape.past, shape.new, compiled.past, compiled.new);
        let spec = &self.spec;
        let past_plan: Vec<Option<usize>> = (0..pc).map(|i| (i < p).then_some(i)).collect();
        let padded = |t: &Tensor, fill: &dyn Fn(usize) -> i64| -> Result<Tensor, RunError> {
            let mut v = t.to_i64_vec();
            if t.shape() != [1, s] {
                return Err(RunError::Input(format!("a step of {s} new tokens got an input of shape {:?}", t.shape())));
            }
            v.extend((s..sc).map(fill));
            Ok(Tensor::from_vec(vec![1, sc], v).expect("[1,sc] ids"))
        };
        let mut feed = BTreeMap::new();
        for (name, t) in inputs {
            let t = if spec.past.iter().flatten().any(|n| n == name) {
                gather_positions(t, p, &past_plan)?
            } else if *name == spec.input_ids {
                padded(t, &|_| 0)?
            } else if *name == spec.position_ids {
                padded(t, &|i| (p + i) as i64)?
            } else if *name == spec.attention_mask {
                let mask: Vec<i64> = (0..pc + sc).map(|i| i64::from(i < p || i >= pc)).collect();
                Tensor::from_vec(vec![1, pc + sc], mask).expect("[1,n] mask")
            } else {
                t.clone()
            };
            feed.insert(name.clone(), t);
        }
        let mut out = self.run_program(compiled, &feed)?;
        let present_plan: Vec<Option<usize>> = (0..p).chain(pc..pc + s).map(Some).collect();
        for (name, t) in &mut out {
            if spec.present.iter().flatten().any(|n| n == name) {
                *t = gather_positions(t, pc + sc, &present_plan)?;
            } else if *name == spec.logits {
                *t = first_rows(t, s)?;
            }
        }
        Ok(out)
    }

    fn tensor_backend_type(&self) -> &str {
        "cpu"
    }
}

/// The outcome of one [`Generator::generate`] request.
#[derive(Debug)]
pub struct Generated {
    /// The generated token ids.
    pub ids: Vec<Token>,
    /// Row `i`: the logits `ids[i]` was picked from, f32 `[ids.len(), vocab]`.
    pub logits: Tensor,
    /// What the request cost and saved.
    pub counters: Counters,
    /// The resulting state: the prompt and every generated token but the last.
    pub state: BackendState,
}

/// Greedy generation with a decoder step model, reusing cached prefixes (see the module docs).
pub struct Generator {
    decoder: Arc<Decoder>,
    programs: Arc<StepPrograms>,
    session: TokenSession,
}

impl Generator {
    /// Opens the model at `path`: a model folder holding `model.onnx`, or the `.onnx` file itself.
    pub fn open(path: &Path, options: &GenerateOptions) -> Result<Generator, Error> {
        let file = if path.is_dir() { path.join("model.onnx") } else { path.to_path_buf() };
        let programs = Arc::new(StepPrograms::open(&file, options)?);
        let (fingerprint, spec) = (programs.fingerprint(), programs.spec().clone());
        let name = path.file_name().map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned());
        let decoder = Arc::new(Decoder::new(name.clone(), fingerprint, spec, programs.clone())?);
        let session = TokenSession::new(decoder.clone(), name, options.cache_budget)?;
        Ok(Generator { decoder, programs, session })
    }

    /// The token backend.
    pub fn decoder(&self) -> &Arc<Decoder> {
        &self.decoder
    }

    /// What compiling and running steps cost so far.
    pub fn step_stats(&self) -> StepStats {
        self.programs.stats()
    }

    /// The prefix cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.session.cache_stats()
    }

    /// Generates `max_new_tokens` tokens after `prompt`, resuming from the longest cached prefix.
    pub fn generate(&mut self, prompt: &[Token], max_new_tokens: u32) -> Result<Generated, Error> {
        let g = self.session.generate(prompt, max_new_tokens)?;
        Self::generated(g)
    }

    /// As [`Generator::generate`], resuming from `state` (an imported one) instead of the cache.
    pub fn generate_from(
        &mut self,
        prompt: &[Token],
        max_new_tokens: u32,
        state: &BackendState,
    ) -> Result<Generated, Error> {
        let g = self.session.generate_from(prompt, max_new_tokens, Some(state))?;
        Self::generated(g)
    }

    fn generated(g: kiln_runtime::state::Generation) -> Result<Generated, Error> {
        let missing = |what: &str| Error::Run(RunError::Backend(format!("the decoder returned no {what}")));
        let logits = g.extra.into_iter().next().ok_or_else(|| missing("logits"))?;
        let state = g.state.ok_or_else(|| missing("state"))?;
        Ok(Generated { ids: g.ids, logits, counters: g.counters, state })
    }

    /// A state's bytes in the state format (`docs/generate.md`).
    pub fn export_state(&self, state: &BackendState) -> Result<Vec<u8>, Error> {
        self.decoder
            .export_state(state)
            .ok_or_else(|| Error::Run(RunError::State("the state is not one of this decoder's".into())))
    }

    /// A state from exported bytes; corrupt, truncated or foreign bytes are an [`Error::Run`] saying why.
    pub fn import_state(&self, bytes: &[u8]) -> Result<BackendState, Error> {
        Ok(self.decoder.import_state(bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathering_pads_and_unpads_every_head() {
        // Two heads, three positions, head_dim 1: [a0 a1 a2 | b0 b1 b2].
        let t = Tensor::from_vec(vec![1, 2, 3, 1], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let padded = gather_positions(&t, 3, &[Some(0), Some(1), Some(2), None, None]).unwrap();
        assert_eq!(padded.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 0.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0]);
        let cut = gather_positions(&t, 3, &[Some(0), Some(2)]).unwrap();
        assert_eq!(cut.as_slice::<f32>().unwrap(), &[1.0, 3.0, 4.0, 6.0]);
        assert!(gather_positions(&t, 4, &[Some(0)]).is_err());
        assert!(gather_positions(&t, 3, &[Some(3)]).is_err());
        let logits = Tensor::from_vec(vec![1, 3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(first_rows(&logits, 2).unwrap().as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert!(first_rows(&logits, 4).is_err());
    }
}

//! [`Session`]: a model or artifact opened for running, behind the Python package and the C API — the one place
//! that decides how a path becomes something that runs (an artifact is loaded, a model compiled for its backend,
//! or kept for the interpreter) and what fallbacks are allowed.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_ir::{Tensor, TensorType, TensorView};

use crate::{
    Artifact, Backend, BackendRegistry, CompileOptions, Compiled, Error, Fallback, FallbackPolicy, LoadOptions, Model,
    RunOptions,
};

/// How to open a [`Session`].
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// Worker threads (0: all cores).
    pub threads: usize,
    /// The backend: [`Backend::Cpu`] (compiled), [`Backend::Cuda`] (compiled for GPU 0) or [`Backend::Interp`].
    /// An artifact runs on the backend it was compiled for.
    pub backend: Backend,
    /// Static extents for inputs with symbolic dims (none: compiled with its symbolic dims).
    pub shapes: BTreeMap<String, Vec<usize>>,
    /// [`FallbackPolicy::Deny`] refuses a program with interpreter nodes; `Warn` and `Allow` open it (the caller
    /// reports [`Session::fallbacks`] as it sees fit).
    pub fallback: FallbackPolicy,
}

enum Engine {
    Compiled(Compiled),
    Interp(Model),
}

/// A model ready to run, from any number of threads at once.
pub struct Session {
    engine: Engine,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
}

impl Session {
    /// Opens an artifact directory of `kiln compile`, or loads a model file (ONNX, `.kir`, graph JSON) and
    /// compiles it for `options.backend`.
    pub fn open(path: &Path, options: &SessionOptions) -> Result<Session, Error> {
        if Artifact::is_artifact(path) {
            if !options.shapes.is_empty() {
                return Err(Error::Input(
                    "shapes: a compiled artifact's shapes were fixed when it was compiled".into(),
                ));
            }
            let backends = registry()?;
            let compiled = if Artifact::is_cuda(path) {
                Artifact::load_cuda_with(path, 0, &backends)?
            } else {
                Artifact::load_with(path, options.threads, &backends)?
            };
            return Session::from_compiled(compiled, options.fallback);
        }
        let model = Model::load(path, &LoadOptions { shapes: options.shapes.clone(), ..Default::default() })?;
        Session::from_model(&model, options)
    }

    /// Imports an ONNX model from its bytes and compiles it (`shown` names it in messages).
    pub fn from_onnx_bytes(bytes: &[u8], shown: &str, options: &SessionOptions) -> Result<Session, Error> {
        let model = Model::from_onnx_bytes(
            bytes,
            shown,
            &LoadOptions { shapes: options.shapes.clone(), ..Default::default() },
        )?;
        Session::from_model(&model, options)
    }

    /// Compiles `model` for `options.backend` (the interpreter keeps the model).
    pub fn from_model(model: &Model, options: &SessionOptions) -> Result<Session, Error> {
        if options.backend == Backend::Interp {
            let g = model.graph();
            let outputs =
                g.outputs().iter().filter_map(|(n, v)| g.value_type(*v).map(|t| (n.clone(), t.clone()))).collect();
            return Ok(Session { inputs: model.inputs(), outputs, engine: Engine::Interp(model.clone()) });
        }
        let info = options.backend.info();
        let pipeline = info.pipeline.filter(|_| info.compile_target).ok_or_else(|| Error::Backend {
            backend: info.name,
            message: format!("not a compile target: {}", info.not_compiled),
        })?;
        let compile = CompileOptions {
            backend: options.backend,
            pipeline: pipeline.to_string(),
            threads: options.threads,
            backends: registry()?,
            fallback: options.fallback.reported_by_caller(),
        };
        Session::from_compiled(model.compile(&compile)?, options.fallback)
    }

    fn from_compiled(compiled: Compiled, fallback: FallbackPolicy) -> Result<Session, Error> {
        if fallback == FallbackPolicy::Deny && !compiled.fallbacks().is_empty() {
            return Err(Error::Fallback(compiled.fallbacks().to_vec()));
        }
        Ok(Session {
            inputs: compiled.inputs().to_vec(),
            outputs: compiled.outputs(),
            engine: Engine::Compiled(compiled),
        })
    }

    /// Input names and declared types, in order.
    pub fn inputs(&self) -> &[(String, TensorType)] {
        &self.inputs
    }

    /// Output names and types, in order.
    pub fn outputs(&self) -> &[(String, TensorType)] {
        &self.outputs
    }

    /// The backend it runs on (`cpu`, `cuda`, `interp`).
    pub fn backend(&self) -> &'static str {
        match &self.engine {
            Engine::Compiled(c) => c.backend(),
            Engine::Interp(_) => "interp",
        }
    }

    /// The nodes run on the reference interpreter, with why (empty when everything is compiled).
    pub fn fallbacks(&self) -> &[Fallback] {
        match &self.engine {
            Engine::Compiled(c) => c.fallbacks(),
            Engine::Interp(_) => &[],
        }
    }

    /// Runs on borrowed inputs (by name, each once; compiled backends bind them without a copy); outputs in the
    /// model's order.
    pub fn run_views(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<(String, Tensor)>, Error> {
        match &self.engine {
            Engine::Compiled(c) => c.run_views(inputs),
            Engine::Interp(m) => {
                let mut given = BTreeMap::new();
                for (name, view) in inputs {
                    if given.insert(name.to_string(), view.to_tensor()).is_some() {
                        return Err(Error::Input(format!("input `{name}` is given twice")));
                    }
                }
                m.run(&given, &RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() })
            }
        }
    }
}

/// The built-in backends and the plugins of `KILN_BACKEND_PLUGINS`, as the CLI uses.
fn registry() -> Result<BackendRegistry, Error> {
    BackendRegistry::from_env().map_err(Error::Run)
}

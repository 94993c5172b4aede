//! The backend registry: named [`Backend`]s with priorities, and selection of one per node by capability.
//!
//! Selection is plain data matching — [`Capabilities::missing_for`] against the node — so the registry never
//! calls a backend to find out whether it can run something. Among the backends that cover a node, the highest
//! priority wins; **ties go to the name that sorts first** (byte-wise), so the choice never depends on
//! registration order or hashing. When none covers the node, [`RunError::NoBackend`] lists every registered
//! backend with the reason it was refused: there is no silent fallback.
//!
//! The registry is in the execution path: compiling a model places each node on the backend this rule selects
//! ([`crate::placement`]), the compiled CPU code being the entry [`COMPILED_CPU_BACKEND`] (priority 0) beside the
//! reference interpreter ([`REFERENCE_BACKEND`], priority 0, which the name order puts after it).
//!
//! Plugins ([`crate::plugin`]) join the registry through [`BackendRegistry::load_plugin`] or the
//! `KILN_BACKEND_PLUGINS` environment variable in the seed's grammar: `;`-separated `name[@priority]=path`
//! entries (the exact rules are on [`parse_plugin_specs`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::RunError;
use crate::contract::{Backend, Capabilities, Node};
use crate::cpu::node::ReferenceBackend;

/// The environment variable [`BackendRegistry::load_plugins_from_env`] reads.
pub const PLUGINS_ENV_VAR: &str = "KILN_BACKEND_PLUGINS";

/// The name [`BackendRegistry::with_defaults`] gives the reference backend.
pub const REFERENCE_BACKEND: &str = "cpu-reference";

/// The name of the compiled CPU code's entry in [`BackendRegistry::with_defaults`].
pub const COMPILED_CPU_BACKEND: &str = "cpu";

/// A registered backend.
#[derive(Clone)]
struct Entry {
    backend: Arc<dyn Backend>,
    priority: i32,
}

/// The backend chosen for a node.
#[derive(Clone)]
pub struct Selection {
    /// Its registered name.
    pub name: String,
    /// The backend.
    pub backend: Arc<dyn Backend>,
    /// Its capabilities at selection time.
    pub capabilities: Capabilities,
    /// Its priority.
    pub priority: i32,
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selection")
            .field("name", &self.name)
            .field("capabilities", &self.capabilities)
            .field("priority", &self.priority)
            .finish()
    }
}

/// Named backends with priorities.
#[derive(Clone, Default)]
pub struct BackendRegistry {
    backends: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for BackendRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.backends.iter().map(|(n, e)| (n, e.priority))).finish()
    }
}

/// Orders candidates best first: higher priority, then the name that sorts first.
fn better_first(a: &(&String, &Entry), b: &(&String, &Entry)) -> std::cmp::Ordering {
    b.1.priority.cmp(&a.1.priority).then_with(|| a.0.cmp(b.0))
}

impl BackendRegistry {
    /// An empty registry.
    pub fn new() -> BackendRegistry {
        BackendRegistry::default()
    }

    /// A registry holding the built-in backends, both with priority 0: the compiled CPU code
    /// ([`CompiledCpuBackend`], every tensor op) as [`COMPILED_CPU_BACKEND`], and the reference backend
    /// ([`ReferenceBackend`], every tensor op on the host) as [`REFERENCE_BACKEND`].
    pub fn with_defaults() -> BackendRegistry {
        let mut r = BackendRegistry::new();
        r.register(COMPILED_CPU_BACKEND, Arc::new(CompiledCpuBackend), 0).expect("an empty registry has no duplicates");
        r.register(REFERENCE_BACKEND, Arc::new(ReferenceBackend), 0).expect("an empty registry has no duplicates");
        r
    }

    /// [`BackendRegistry::with_defaults`] plus the plugins `KILN_BACKEND_PLUGINS` lists (a malformed list or a
    /// plugin that fails to load is an error): the registry every `kiln` command that runs models uses.
    pub fn from_env() -> Result<BackendRegistry, RunError> {
        let mut r = BackendRegistry::with_defaults();
        r.load_plugins_from_env()?;
        Ok(r)
    }

    /// [`BackendRegistry::with_defaults`], plus CUDA device 0 as `cuda` ([`crate::cuda::CudaNodeBackend`], priority
    /// [`crate::cuda::CUDA_PRIORITY`], above the host's) when this machine has one. Also returns why no device was
    /// added, if none was.
    pub fn with_devices() -> (BackendRegistry, Option<String>) {
        let mut r = BackendRegistry::with_defaults();
        let device = crate::cuda::CudaDevice::open(0)
            .and_then(|d| crate::cuda::CudaGpu::new(d, "", &[]))
            .map(|gpu| Arc::new(crate::cuda::CudaNodeBackend::new(Arc::new(gpu))));
        match device {
            Ok(b) => {
                r.register("cuda", b, crate::cuda::CUDA_PRIORITY).expect("`cuda` is not registered yet");
                (r, None)
            }
            Err(e) => (r, Some(e.to_string())),
        }
    }

    /// Adds `backend` as `name` with `priority` (higher wins). A name that is not valid ([`check_name`]) or one
    /// already registered is an error.
    pub fn register(&mut self, name: &str, backend: Arc<dyn Backend>, priority: i32) -> Result<(), RunError> {
        check_name(name)?;
        if self.backends.contains_key(name) {
            return Err(RunError::Registry(format!("a backend named `{name}` is already registered")));
        }
        self.backends.insert(name.to_string(), Entry { backend, priority });
        Ok(())
    }

    /// The backend registered as `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Backend>> {
        self.backends.get(name).map(|e| Arc::clone(&e.backend))
    }

    /// The priority of the backend registered as `name`.
    pub fn priority(&self, name: &str) -> Option<i32> {
        self.backends.get(name).map(|e| e.priority)
    }

    /// Whether a backend is registered as `name`.
    pub fn has(&self, name: &str) -> bool {
        self.backends.contains_key(name)
    }

    /// Every registered name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.backends.keys().cloned().collect()
    }

    /// How many backends are registered.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// The name and priority of the best backend for nodes of `kind` (as [`Self::backend_for`]).
    pub fn select_kind(&self, kind: &str) -> Option<(String, i32)> {
        let best = self.best_for_kind(kind)?;
        Some((best.0.clone(), best.1.priority))
    }

    /// The best backend for nodes of `kind` — an op mnemonic (`matmul`) or `token` — ignoring everything about
    /// a node but its kind (a token node's need for a prefix cache, say). Same order as [`Self::select`].
    pub fn backend_for(&self, kind: &str) -> Option<Arc<dyn Backend>> {
        self.best_for_kind(kind).map(|(_, e)| Arc::clone(&e.backend))
    }

    fn best_for_kind(&self, kind: &str) -> Option<(&String, &Entry)> {
        let mut fits: Vec<(&String, &Entry)> = self
            .backends
            .iter()
            .filter(|(_, e)| {
                let caps = e.backend.capabilities();
                if kind == "token" { caps.token } else { caps.tensor && caps.ops.covers(kind) }
            })
            .collect();
        fits.sort_by(better_first);
        fits.first().copied()
    }

    /// The best backend for `node`: the highest priority among those whose capabilities cover it, ties to the
    /// name that sorts first. None fits: [`RunError::NoBackend`] with one `name: reason` line per backend.
    pub fn select(&self, node: &Node) -> Result<Selection, RunError> {
        let mut fits = Vec::new();
        let mut considered = Vec::new();
        for (name, entry) in &self.backends {
            let caps = entry.backend.capabilities();
            match caps.missing_for(node) {
                None => fits.push((name, entry, caps)),
                Some(why) => considered.push(format!("{name} (priority {}): {why}", entry.priority)),
            }
        }
        fits.sort_by(|a, b| better_first(&(a.0, a.1), &(b.0, b.1)));
        match fits.into_iter().next() {
            Some((name, entry, capabilities)) => Ok(Selection {
                name: name.clone(),
                backend: Arc::clone(&entry.backend),
                capabilities,
                priority: entry.priority,
            }),
            None => {
                Err(RunError::NoBackend { node: node.name.clone(), kind: node.kind_name().to_string(), considered })
            }
        }
    }

    /// Loads the plugin at `path` and registers it as `name`. Errors name the plugin: a missing file, a library
    /// without `kiln_backend_entry`, a wrong ABI version or struct size, a duplicate name.
    pub fn load_plugin(&mut self, name: &str, path: &Path, priority: i32) -> Result<(), RunError> {
        self.check_new_name(name)?;
        let backend = crate::plugin::PluginBackend::load(path, Some(name))?;
        self.register(name, Arc::new(backend), priority)
    }

    /// Registers a backend from a vtable already in memory as `name` (the seed's `MakeBackendFromAbi`): a plugin
    /// linked into the process, or one the caller loaded itself. The vtable is checked as a loaded plugin's is.
    ///
    /// # Safety
    /// As [`crate::plugin::PluginBackend::from_vtable`]: `table` is null or a valid vtable of the version it
    /// declares, whose pointers stay valid until its `destroy` runs.
    pub unsafe fn register_vtable(
        &mut self,
        name: &str,
        table: *const crate::plugin::abi::KilnBackendVtable,
        priority: i32,
    ) -> Result<(), RunError> {
        check_name(name)?;
        self.check_new_name(name)?;
        // SAFETY: the caller's contract.
        let backend = unsafe { crate::plugin::PluginBackend::from_vtable(table, name) }?;
        self.register(name, Arc::new(backend), priority)
    }

    /// Loads the plugins listed in [`PLUGINS_ENV_VAR`]; see [`Self::load_plugins_from_var`].
    pub fn load_plugins_from_env(&mut self) -> Result<usize, RunError> {
        self.load_plugins_from_var(PLUGINS_ENV_VAR)
    }

    /// Loads the plugins listed in the environment variable `var` (unset or blank: none). Returns how many were
    /// loaded; see [`Self::load_plugins_from_spec`] for what happens on an error. Errors are those of the spec
    /// (they quote the offending entry, not the variable: callers name the variable in their context).
    pub fn load_plugins_from_var(&mut self, var: &str) -> Result<usize, RunError> {
        match std::env::var(var) {
            Ok(spec) => self.load_plugins_from_spec(&spec),
            Err(std::env::VarError::NotPresent) => Ok(0),
            Err(std::env::VarError::NotUnicode(_)) => Err(RunError::Registry(format!("{var} is not valid UTF-8"))),
        }
    }

    /// Loads the plugins a spec string lists (the format of [`parse_plugin_specs`]). All or nothing: the whole
    /// spec is parsed and every plugin loaded before any is registered, so after an error the registry is as it
    /// was. Returns how many were loaded.
    pub fn load_plugins_from_spec(&mut self, spec: &str) -> Result<usize, RunError> {
        let specs = parse_plugin_specs(spec)?;
        for s in &specs {
            self.check_new_name(&s.name)?;
        }
        let mut loaded = Vec::with_capacity(specs.len());
        for s in &specs {
            let backend = crate::plugin::PluginBackend::load(&s.path, Some(&s.name))?;
            loaded.push((s, backend));
        }
        let n = loaded.len();
        for (s, backend) in loaded {
            tracing::info!(name = %s.name, path = %s.path.display(), priority = s.priority, "plugin loaded");
            self.register(&s.name, Arc::new(backend), s.priority)?;
        }
        Ok(n)
    }

    fn check_new_name(&self, name: &str) -> Result<(), RunError> {
        if self.has(name) {
            return Err(RunError::Registry(format!("a backend named `{name}` is already registered")));
        }
        Ok(())
    }

    /// One line per backend, best first for tensor work (priority descending, then name): name, priority, tensor
    /// backend type and capabilities. What `kiln backends` prints.
    pub fn describe(&self) -> Vec<String> {
        let mut all: Vec<(&String, &Entry)> = self.backends.iter().collect();
        all.sort_by(better_first);
        all.into_iter()
            .map(|(name, e)| {
                let ty = e.backend.tensor_backend_type();
                format!(
                    "{name}  priority {}  type {}  {}",
                    e.priority,
                    if ty.is_empty() { "-" } else { ty },
                    e.backend.capabilities()
                )
            })
            .collect()
    }
}

/// One `name[@priority]=path` entry of a plugin list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginSpec {
    /// The name to register the plugin as.
    pub name: String,
    /// The shared library.
    pub path: PathBuf,
    /// Its priority (0 when not given).
    pub priority: i32,
}

/// Names kiln registers itself; a plugin may not take them.
const RESERVED_NAMES: [&str; 3] = [COMPILED_CPU_BACKEND, REFERENCE_BACKEND, crate::cuda::CUDA_BACKEND];

/// Checks a backend name: not empty, and none of `@`, `=`, `;`, `,`, whitespace or control characters (they
/// delimit plugin lists, or would make a name that prints ambiguously).
pub fn check_name(name: &str) -> Result<(), RunError> {
    if name.is_empty() {
        return Err(RunError::Registry("a backend name must not be empty".into()));
    }
    if let Some(c) = name.chars().find(|c| matches!(c, '@' | '=' | ';' | ',') || c.is_whitespace() || c.is_control()) {
        return Err(RunError::Registry(format!(
            "backend name `{}` contains {} (names may not contain `@`, `=`, `;`, `,`, whitespace or control \
             characters)",
            name.escape_debug(),
            if c.is_whitespace() || c.is_control() { format!("{:?}", c) } else { format!("`{c}`") }
        )));
    }
    Ok(())
}

/// Parses a plugin list in the seed's grammar: `name[@priority]=path` entries separated by `;`.
///
/// Rules, in order:
/// - Entries are separated by `;`. Whitespace around an entry is trimmed, and an empty entry is skipped
///   (`a=x.so;;b=y.so`, a trailing `;`).
/// - The name is everything before the first `=`, optionally followed by `@priority`; it must be a valid name
///   ([`check_name`]) and not one kiln reserves (`cpu`, `cpu-reference`, `cuda`). An entry without `=` is an
///   error.
/// - The priority, when given, is a decimal `i32` (a sign allowed); anything else (`@`, `@1.5`, `@x`,
///   `@99999999999`) is an error. Without it the priority is 0.
/// - The path is everything after the first `=`, trimmed; it must not be empty.
/// - A name given twice: the later entry replaces the earlier (the seed registers by name).
/// - Two forms that older kilns accepted are refused with a message, never read some other way: entries
///   separated by `,` (a path holding `,name=` is taken as that mistake) and a priority after the path
///   (`name=path:3`; a path ending in `:` and digits is taken as that mistake).
pub fn parse_plugin_specs(spec: &str) -> Result<Vec<PluginSpec>, RunError> {
    let mut out: Vec<PluginSpec> = Vec::new();
    for (i, entry) in spec.split(';').enumerate() {
        let n = i + 1;
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let bad = |why: String| RunError::Registry(format!("plugin spec #{n} `{entry}`: {why}"));
        let Some((head, path)) = entry.split_once('=') else {
            return Err(bad("missing `=path` (expected name[@priority]=path)".into()));
        };
        let head = head.trim();
        let (name, priority) = match head.split_once('@') {
            Some((name, p)) => {
                let p = p.trim();
                let priority = p
                    .parse::<i32>()
                    .map_err(|_| bad(format!("bad priority `{p}` (expected an integer in i32 range after `@`)")))?;
                (name.trim(), priority)
            }
            None => (head, 0),
        };
        if name.is_empty() {
            return Err(bad("empty name (expected name[@priority]=path)".into()));
        }
        check_name(name).map_err(|e| bad(e.to_string().trim_start_matches("backend registry: ").to_string()))?;
        if RESERVED_NAMES.contains(&name) {
            return Err(bad(format!("`{name}` is the name of a backend kiln registers itself; choose another")));
        }
        let path = path.trim();
        if path.is_empty() {
            return Err(bad("missing path (expected name[@priority]=path)".into()));
        }
        if let Some((_, rest)) = path.split_once(',')
            && rest.contains('=')
        {
            return Err(bad("entries are separated by `;`, not `,` (expected name[@priority]=path;…)".into()));
        }
        if let Some((_, tail)) = path.rsplit_once(':')
            && !tail.is_empty()
            && tail.trim_start_matches(['+', '-']).chars().all(|c| c.is_ascii_digit())
        {
            return Err(bad(format!(
                "ambiguous `:{tail}` after the path: a priority is written before the `=` (`{name}@{tail}=…`)"
            )));
        }
        out.retain(|s| s.name != name);
        out.push(PluginSpec { name: name.to_string(), path: PathBuf::from(path), priority });
    }
    Ok(out)
}

/// A backend for the compiled CPU code, as the registry lists it: it covers every tensor op, because the
/// compiler generates code for whatever the placement leaves on it (interpreter fallbacks included, which
/// `kiln` reports). The registry entry is what placement compares plugins against; a node handed to it on its
/// own, outside a compiled model, runs on the reference interpreter (compiling a single node needs the
/// compiler, which the runtime does not link).
#[derive(Clone, Copy, Debug, Default)]
pub struct CompiledCpuBackend;

impl Backend for CompiledCpuBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities { tensor: true, ops: crate::contract::OpSupport::All, ..Capabilities::none() }
    }

    fn tensor_backend_type(&self) -> &str {
        "cpu"
    }

    fn run_with_cache(
        &self,
        node: &Node,
        inputs: &[kiln_ir::Tensor],
        prefix_state: Option<&crate::contract::BackendState>,
        remaining_tokens: u32,
    ) -> Result<crate::contract::RunResult, RunError> {
        ReferenceBackend.run_with_cache(node, inputs, prefix_state, remaining_tokens)
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::Op;
    use kiln_ir::op::{BinaryOp, UnaryOp};

    use super::*;
    use crate::contract::{OpSupport, RunResult};

    /// A backend that only declares capabilities.
    struct Fake(Capabilities);

    impl Backend for Fake {
        fn capabilities(&self) -> Capabilities {
            self.0.clone()
        }
        fn run_with_cache(
            &self,
            node: &Node,
            _: &[kiln_ir::Tensor],
            _: Option<&crate::contract::BackendState>,
            _: u32,
        ) -> Result<RunResult, RunError> {
            Err(RunError::Unsupported { node: node.name.clone(), reason: "fake".into() })
        }
    }

    fn ops(names: &[&str]) -> Arc<dyn Backend> {
        Arc::new(Fake(Capabilities {
            tensor: true,
            ops: OpSupport::only(names.iter().copied()),
            ..Capabilities::none()
        }))
    }

    fn tokens(cache: bool) -> Arc<dyn Backend> {
        Arc::new(Fake(Capabilities { token: true, cache, ..Capabilities::none() }))
    }

    fn add() -> Node {
        Node::op("n0", Op::Binary(BinaryOp::Add))
    }

    #[test]
    fn highest_priority_covering_backend_wins() {
        let mut r = BackendRegistry::with_defaults();
        r.register("fast-add", ops(&["add", "mul"]), 10).unwrap();
        r.register("low", ops(&["add"]), -5).unwrap();
        r.register("mul-only", ops(&["mul"]), 100).unwrap();
        let s = r.select(&add()).unwrap();
        assert_eq!((s.name.as_str(), s.priority), ("fast-add", 10));
        assert!(s.capabilities.ops.covers("add"));
        // An op only the built-in backends cover falls to the compiled code (which ties with the reference
        // backend at priority 0 and sorts first).
        let s = r.select(&Node::op("e", Op::Unary(UnaryOp::Exp))).unwrap();
        assert_eq!(s.name, COMPILED_CPU_BACKEND);
        assert!(Arc::ptr_eq(&r.backend_for("mul").unwrap(), &r.get("mul-only").unwrap()));
        assert!(Arc::ptr_eq(&r.backend_for("exp").unwrap(), &r.get(COMPILED_CPU_BACKEND).unwrap()));
        assert_eq!(r.select_kind("add"), Some(("fast-add".to_string(), 10)));
        assert_eq!(r.select_kind("exp"), Some((COMPILED_CPU_BACKEND.to_string(), 0)));
        assert!(r.backend_for("token").is_none());
    }

    #[test]
    fn ties_go_to_the_name_that_sorts_first_whatever_the_registration_order() {
        for order in [["b", "a", "c"], ["c", "b", "a"], ["a", "c", "b"]] {
            let mut r = BackendRegistry::new();
            for n in order {
                r.register(n, ops(&["add"]), 3).unwrap();
            }
            assert_eq!(r.select(&add()).unwrap().name, "a");
            assert!(Arc::ptr_eq(&r.backend_for("add").unwrap(), &r.get("a").unwrap()));
        }
    }

    #[test]
    fn token_nodes_need_token_and_cache_capabilities() {
        let mut r = BackendRegistry::with_defaults();
        r.register("no-cache", tokens(false), 5).unwrap();
        r.register("cached", tokens(true), 1).unwrap();
        assert_eq!(r.select(&Node::token("t", "m", false, 1)).unwrap().name, "no-cache");
        assert_eq!(r.select(&Node::token("t", "m", true, 1)).unwrap().name, "cached");
        assert!(Arc::ptr_eq(&r.backend_for("token").unwrap(), &r.get("no-cache").unwrap()));
    }

    #[test]
    fn no_backend_lists_every_backend_with_its_reason() {
        let mut r = BackendRegistry::with_defaults();
        r.register("adder", ops(&["add"]), 2).unwrap();
        r.register("decoder", tokens(false), 1).unwrap();
        let err = r.select(&Node::token("req-7", "llm", true, 1)).unwrap_err();
        let RunError::NoBackend { node, kind, considered } = &err else { panic!("{err:?}") };
        assert_eq!((node.as_str(), kind.as_str()), ("req-7", "token"));
        assert_eq!(
            considered,
            &vec![
                "adder (priority 2): no token support".to_string(),
                "cpu (priority 0): no token support".to_string(),
                "cpu-reference (priority 0): no token support".to_string(),
                "decoder (priority 1): no prefix-cache support".to_string(),
            ]
        );
        let text = err.to_string();
        assert!(text.contains("no backend can run node `req-7` (token)") && text.contains("decoder"), "{text}");
        let err = BackendRegistry::new().select(&add()).unwrap_err();
        assert!(err.to_string().contains("none registered"), "{err}");
        let mut r = BackendRegistry::new();
        r.register("adder", ops(&["add"]), 0).unwrap();
        let err = r.select(&Node::op("m", Op::MatMul)).unwrap_err().to_string();
        assert!(err.contains("adder (priority 0): op `matmul` not among add"), "{err}");
    }

    #[test]
    fn duplicate_and_empty_names_are_refused() {
        let mut r = BackendRegistry::with_defaults();
        let err = r.register(REFERENCE_BACKEND, ops(&["add"]), 9).unwrap_err();
        assert_eq!(err, RunError::Registry("a backend named `cpu-reference` is already registered".into()));
        assert_eq!(r.priority(REFERENCE_BACKEND), Some(0), "the first registration stays");
        assert!(matches!(r.register(" ", ops(&["add"]), 0), Err(RunError::Registry(_))));
        // A duplicate is caught before the plugin file is even looked at.
        let err = r.load_plugin(REFERENCE_BACKEND, Path::new("/nonexistent.so"), 0).unwrap_err();
        assert!(err.to_string().contains("already registered"), "{err}");
        let err = r.load_plugins_from_spec("cpu-reference=/nonexistent.so").unwrap_err();
        assert!(err.to_string().contains("kiln registers itself"), "{err}");
        assert_eq!(r.names(), vec![COMPILED_CPU_BACKEND.to_string(), REFERENCE_BACKEND.to_string()]);
        assert!(r.has(REFERENCE_BACKEND) && !r.has("x") && r.get("x").is_none());
    }

    #[test]
    fn a_failed_plugin_list_registers_nothing() {
        let mut r = BackendRegistry::with_defaults();
        let err = r.load_plugins_from_spec("a@3=/nonexistent/a.so").unwrap_err();
        assert!(matches!(&err, RunError::Plugin { name, message } if name == "a" && message.contains("no such file")));
        assert_eq!(r.len(), 2);
        assert_eq!(r.load_plugins_from_spec("  ").unwrap(), 0);
        assert_eq!(r.load_plugins_from_var("KILN_TEST_SURELY_UNSET_VARIABLE").unwrap(), 0);
    }

    #[test]
    fn describe_lists_backends_best_first() {
        let mut r = BackendRegistry::with_defaults();
        r.register("decoder", tokens(true), 7).unwrap();
        assert_eq!(
            r.describe(),
            vec![
                "decoder  priority 7  type -  token cache",
                "cpu  priority 0  type cpu  tensor(all ops)",
                "cpu-reference  priority 0  type cpu  tensor(all ops)"
            ]
        );
    }

    fn spec(name: &str, path: &str, priority: i32) -> PluginSpec {
        PluginSpec { name: name.into(), path: path.into(), priority }
    }

    #[test]
    fn plugin_specs_parse() {
        let cases: &[(&str, Vec<PluginSpec>)] = &[
            ("", vec![]),
            ("   ", vec![]),
            (";;", vec![]),
            ("ew=/p/libew.so", vec![spec("ew", "/p/libew.so", 0)]),
            ("ew@5=/p/libew.so", vec![spec("ew", "/p/libew.so", 5)]),
            ("ew@-3=/p/libew.so", vec![spec("ew", "/p/libew.so", -3)]),
            ("ew@+4=/p/libew.so", vec![spec("ew", "/p/libew.so", 4)]),
            (" a @ 2 = x.so ; b=y.so ", vec![spec("a", "x.so", 2), spec("b", "y.so", 0)]),
            // The example: an empty entry skipped, the default priority.
            (
                "echo@50=/path/libx.so;;other=/path/liby.so",
                vec![spec("echo", "/path/libx.so", 50), spec("other", "/path/liby.so", 0)],
            ),
            ("a=x.so;", vec![spec("a", "x.so", 0)]),
            // A later duplicate replaces the earlier one.
            ("a=x.so;b=y.so;a@2=z.so", vec![spec("b", "y.so", 0), spec("a", "z.so", 2)]),
            // Paths may hold `:`, `=`, `@` and `,` when nothing makes them ambiguous.
            ("a=/opt/k:v/lib.so", vec![spec("a", "/opt/k:v/lib.so", 0)]),
            ("a=/p/x=y.so", vec![spec("a", "/p/x=y.so", 0)]),
            ("a=/p/v@2/lib.so", vec![spec("a", "/p/v@2/lib.so", 0)]),
            ("a=/p/a,b.so", vec![spec("a", "/p/a,b.so", 0)]),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_plugin_specs(text).unwrap(), want, "{text:?}");
        }
    }

    #[test]
    fn bad_plugin_specs_are_clear_errors() {
        let cases = [
            ("=x.so", "#1 `=x.so`: empty name"),
            ("@3=x.so", "empty name"),
            ("a=x.so;=y.so", "#2 `=y.so`: empty name"),
            ("a", "#1 `a`: missing `=path`"),
            ("a=", "#1 `a=`: missing path"),
            ("a@3=", "missing path"),
            ("a@=x.so", "bad priority ``"),
            ("a@1.5=x.so", "bad priority `1.5`"),
            ("a@99999999999=x.so", "bad priority `99999999999`"),
            ("a@x=x.so", "bad priority `x`"),
            ("a@1@2=x.so", "bad priority `1@2`"),
            ("a b=x.so", "contains ' '"),
            ("a,b=x.so", "contains `,`"),
            ("cpu=x.so", "kiln registers itself"),
            ("cuda@9=x.so", "kiln registers itself"),
            ("cpu-reference=x.so", "kiln registers itself"),
            // The old forms are refused, never read another way.
            ("a=x.so,b=y.so", "separated by `;`, not `,`"),
            ("a=x.so:3", "ambiguous `:3`"),
            ("a=x.so:-1", "ambiguous `:-1`"),
        ];
        for (text, needle) in cases {
            let err = parse_plugin_specs(text).unwrap_err();
            assert!(matches!(err, RunError::Registry(_)), "{text:?}: {err:?}");
            let shown = err.to_string();
            assert!(shown.contains(needle), "{text:?}: `{shown}` should contain `{needle}`");
            assert_eq!(shown.lines().count(), 1, "{text:?}: one line");
        }
    }

    #[test]
    fn names_are_checked_when_registering() {
        let mut r = BackendRegistry::new();
        for bad in ["", "a@b", "a=b", "a;b", "a,b", "a b", "a\tb", "a\nb"] {
            assert!(matches!(r.register(bad, ops(&["add"]), 0), Err(RunError::Registry(_))), "{bad:?}");
        }
        r.register("fine-name_1.x", ops(&["add"]), 0).unwrap();
    }
}

//! The [`Pass`] trait, the context a pass runs in, pass errors, and typed pass options.
//!
//! A pass is a value built once from its options (`fold-constants{max-elements=1024}`) and run any number of
//! times. It transforms a graph in place and says whether it changed anything; the manager, not the pass, does
//! dumping, timing and verification (rustc's MIR passes and MLIR's pass infrastructure split the work the same
//! way). A pass's stable kebab-case name and its one-line summary come from [`declare_pass!`], which takes them
//! from the name literal and the struct's one-line doc comment, so the registry, the docs and `--help` text can
//! never drift from the code.
//!
//! Options arrive as [`PassOptions`]: the `key=value` pairs written in pipeline text. A pass's constructor takes
//! the ones it knows with typed accessors; the registry then rejects whatever is left, naming the option.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use kiln_ir::Graph;

/// What a pass may consult besides the graph, from the caller: symbol bindings for specialization, and the op
/// kinds another backend runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassContext {
    /// Values for symbolic dims (`batch` → 8); `infer-shapes` specializes them. Pass options win over these.
    pub bindings: BTreeMap<String, u64>,
    /// Op kinds (mnemonics) that the backend placement gives to a backend other than the compiled code: `fuse`
    /// leaves such nodes out of fusion groups and `decompose` leaves them whole, so that backend gets them.
    pub placed_elsewhere: std::collections::BTreeSet<String>,
}

/// A graph transformation. See the module docs.
pub trait Pass {
    /// The stable kebab-case name used in pipelines, dumps and snapshot names.
    fn name(&self) -> &'static str;

    /// One line saying what the pass does (the pass struct's doc comment).
    fn summary(&self) -> &'static str;

    /// Transforms `g` in place; `Ok(true)` when the graph changed. On error the graph may be partly transformed;
    /// the manager keeps a copy of the input for the reproducer.
    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<bool, PassError>;
}

/// A pass failed. Names the pass, and the node when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pass `{pass}`{}: {message}", node.as_ref().map(|n| format!(" at {n}")).unwrap_or_default())]
pub struct PassError {
    /// The failing pass's name.
    pub pass: &'static str,
    /// The node, as `Graph::describe` labels it.
    pub node: Option<String>,
    /// What went wrong.
    pub message: String,
}

impl PassError {
    /// An error of `pass` at the node labelled `node`.
    pub fn at(pass: &'static str, node: impl Into<String>, message: impl Into<String>) -> PassError {
        PassError { pass, node: Some(node.into()), message: message.into() }
    }
}

/// Declares a pass struct with its kebab-case name; its one-line doc comment becomes its summary.
///
/// ```text
/// declare_pass! {
///     /// Removes nodes whose results reach no graph output.
///     #[derive(Clone, Debug, Default)]
///     pub struct Dce = "dce";
/// }
/// ```
/// generates the struct and `Dce::NAME`, `Dce::SUMMARY`. Exactly one doc line is accepted: longer explanations
/// belong in the pass module's `//!` docs. A unit struct has nowhere to keep options, so that form also implements
/// [`FromOptions`] with none; a pass with options uses the braced form and implements `FromOptions` itself.
#[macro_export]
macro_rules! declare_pass {
    (
        #[doc = $summary:literal]
        $(#[$m:meta])*
        $vis:vis struct $name:ident = $kebab:literal;
    ) => {
        #[doc = $summary]
        $(#[$m])*
        $vis struct $name;
        $crate::declare_pass!(@consts $name, $kebab, $summary);
        impl $crate::pass::FromOptions for $name {
            const OPTIONS: &'static [$crate::pass::OptionDoc] = &[];

            fn from_options(_: &mut $crate::pass::PassOptions<'_>) -> Result<$name, $crate::pass::OptionError> {
                Ok($name)
            }
        }
    };
    (
        #[doc = $summary:literal]
        $(#[$m:meta])*
        $vis:vis struct $name:ident = $kebab:literal { $($body:tt)* }
    ) => {
        #[doc = $summary]
        $(#[$m])*
        $vis struct $name { $($body)* }
        $crate::declare_pass!(@consts $name, $kebab, $summary);
    };
    (@consts $name:ident, $kebab:literal, $summary:literal) => {
        impl $name {
            /// The pass's stable kebab-case name.
            pub const NAME: &'static str = $kebab;
            /// The pass's one-line summary (its doc comment, trimmed).
            pub const SUMMARY: &'static str = $crate::pass::trim_doc($summary);
        }
    };
}

/// `s` without leading and trailing ASCII spaces (doc comments carry a leading space), usable in a `const`.
pub const fn trim_doc(s: &'static str) -> &'static str {
    let mut bytes = s.as_bytes();
    while let [b' ', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' '] = bytes {
        bytes = rest;
    }
    match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) => s,
    }
}

/// One option a pass accepts, for docs and error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionDoc {
    /// The option's kebab-case name.
    pub name: &'static str,
    /// The form of its value (`N`, `SYMBOL:N`).
    pub value: &'static str,
    /// What it does, including its default.
    pub summary: &'static str,
}

/// How a pass is built from its options; implemented by every registered pass.
pub trait FromOptions: Sized {
    /// The options the pass accepts.
    const OPTIONS: &'static [OptionDoc];

    /// Builds the pass, taking its options from `options` (the registry rejects any left over).
    fn from_options(options: &mut PassOptions<'_>) -> Result<Self, OptionError>;
}

/// One `key=value` written in pipeline text, with the column where the key starts (when it came from text).
/// Equality ignores the column: the same option written at another place is the same option.
#[derive(Clone, Debug, Eq)]
pub struct OptionValue {
    /// The option's name.
    pub key: String,
    /// Its value, as written.
    pub value: String,
    /// 1-based column of the key in the pipeline text, if parsed from text.
    pub column: Option<usize>,
}

impl PartialEq for OptionValue {
    fn eq(&self, other: &OptionValue) -> bool {
        self.key == other.key && self.value == other.value
    }
}

impl OptionValue {
    /// An option not parsed from text.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> OptionValue {
        OptionValue { key: key.into(), value: value.into(), column: None }
    }
}

/// A pass option was unknown, repeated or malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OptionError {
    /// The option's name.
    pub option: String,
    /// 1-based column of the option in the pipeline text, if known.
    pub column: Option<usize>,
    /// What is wrong (names the option).
    pub message: String,
}

/// The options given to one pass, consumed by its constructor. See the module docs.
#[derive(Debug)]
pub struct PassOptions<'a> {
    pass: &'a str,
    given: &'a [OptionValue],
    taken: Vec<bool>,
}

impl<'a> PassOptions<'a> {
    /// The options written for `pass`.
    pub fn new(pass: &'a str, given: &'a [OptionValue]) -> PassOptions<'a> {
        PassOptions { pass, given, taken: vec![false; given.len()] }
    }

    fn error(&self, o: &OptionValue, message: String) -> OptionError {
        OptionError { option: o.key.clone(), column: o.column, message }
    }

    /// Every value given for `key` (for options that may repeat, like `bind`), marking them used.
    pub fn take_all(&mut self, key: &str) -> Vec<&'a OptionValue> {
        let mut out = Vec::new();
        for (i, o) in self.given.iter().enumerate() {
            if o.key == key {
                self.taken[i] = true;
                out.push(o);
            }
        }
        out
    }

    /// The value of `key` parsed as `T`, or `None` when not given. Giving it twice is an error.
    pub fn take<T: FromStr>(&mut self, key: &str) -> Result<Option<T>, OptionError>
    where
        T::Err: fmt::Display,
    {
        let all = self.take_all(key);
        match all.as_slice() {
            [] => Ok(None),
            [o] => {
                o.value.parse::<T>().map(Some).map_err(|e| {
                    self.error(o, format!("option `{key}` of `{}`: bad value `{}`: {e}", self.pass, o.value))
                })
            }
            [_, o, ..] => Err(self.error(o, format!("option `{key}` of `{}` is given more than once", self.pass))),
        }
    }

    /// Errors naming the first option no accessor took, listing the options the pass knows.
    pub fn finish(self, known: &[&str]) -> Result<(), OptionError> {
        match self.given.iter().zip(&self.taken).find(|(_, t)| !**t) {
            None => Ok(()),
            Some((o, _)) => {
                let known = if known.is_empty() {
                    "it takes no options".to_string()
                } else {
                    format!("it takes {}", known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "))
                };
                Err(self.error(o, format!("unknown option `{}` for `{}`: {known}", o.key, self.pass)))
            }
        }
    }
}

/// `g`'s topological order, or an error of `pass` naming a node on a cycle.
pub fn topo_order(g: &Graph, pass: &'static str) -> Result<Vec<kiln_ir::NodeId>, PassError> {
    g.topo_order().map_err(|c| PassError::at(pass, g.describe(c.0), "the graph has a cycle"))
}

/// The driver of local rewrite passes: visits every live node in topological order, sweep after sweep, until a
/// sweep rewrites nothing or `max_sweeps` sweeps ran (a guard, since each rule shrinks the graph or moves a node
/// one step); `visit` says whether it changed the graph at the node. Nodes removed during a sweep are skipped.
/// Returns whether anything changed.
pub fn sweep_until_stable(
    g: &mut Graph,
    pass: &'static str,
    max_sweeps: usize,
    mut visit: impl FnMut(&mut Graph, kiln_ir::NodeId) -> bool,
) -> Result<bool, PassError> {
    let mut changed = false;
    for _ in 0..max_sweeps {
        let mut swept = false;
        for id in topo_order(g, pass)? {
            if g.contains(id) && visit(g, id) {
                swept = true;
            }
        }
        changed |= swept;
        if !swept {
            break;
        }
    }
    Ok(changed)
}

//! `kiln-passes`: the registry of every optimization pass and named pipeline.
//!
//! This file holds only the registry: [`declare_passes!`] lists every pass (its kebab-case name and one-line
//! summary come from the pass's own [`declare_pass!`]), and [`declare_pipelines!`] lists the named pipelines,
//! which may stand wherever a pass name may in pipeline text (`canonicalize,O1`). The machinery lives beside it:
//! [`pass`] (the [`Pass`] trait, options), [`pipeline`] (text ⇄ [`Pipeline`]), [`manager`] (running a pipeline
//! with [`instrument`]ation), then one module per pass, named after it. `docs/passes.md` is rendered from this
//! registry and checked by a test. The crate never emits code.

pub mod instrument;
pub mod manager;
pub mod pass;
pub mod pipeline;
mod rewrite;

pub mod canonicalize;
pub mod cse;
pub mod dce;
pub mod decompose;
pub mod fold_batchnorm;
pub mod fold_constants;
pub mod fuse;
pub mod infer_shapes;
pub mod integer_products;
pub mod layout;
pub mod plan_memory;
pub mod schedule;
pub mod simplify_shape_arith;
pub mod widen_half;

pub use instrument::{Instrumentation, PassSelection, Reproducer, TimingReport};
pub use kiln_ir as ir;
pub use manager::{Error, PassManager, RunReport};
pub use pass::{FromOptions, OptionDoc, OptionError, OptionValue, Pass, PassContext, PassError, PassOptions};
pub use pipeline::{Pipeline, PipelineItem, PipelineParseError};

/// A registered pass.
#[derive(Clone, Copy)]
pub struct PassInfo {
    /// Stable kebab-case name.
    pub name: &'static str,
    /// One-line summary (the pass struct's doc comment).
    pub summary: &'static str,
    /// The options it accepts.
    pub options: &'static [OptionDoc],
    create: CreatePass,
}

/// Builds a pass from the options written for it.
type CreatePass = fn(&[OptionValue]) -> Result<Box<dyn Pass>, OptionError>;

impl PassInfo {
    /// Builds the pass from options written in pipeline text; unknown, repeated or malformed options are errors
    /// naming the option.
    pub fn create(&self, options: &[OptionValue]) -> Result<Box<dyn Pass>, OptionError> {
        (self.create)(options)
    }
}

impl std::fmt::Debug for PassInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassInfo").field("name", &self.name).finish_non_exhaustive()
    }
}

fn build<P: Pass + FromOptions + 'static>(name: &str, given: &[OptionValue]) -> Result<Box<dyn Pass>, OptionError> {
    let mut options = PassOptions::new(name, given);
    let pass = P::from_options(&mut options)?;
    let known: Vec<&str> = P::OPTIONS.iter().map(|o| o.name).collect();
    options.finish(&known)?;
    Ok(Box::new(pass))
}

/// Declares the list of every pass, in the order docs list them.
macro_rules! declare_passes {
    ($($module:ident :: $ty:ident),* $(,)?) => {
        static PASSES: &[PassInfo] = &[$(
            PassInfo {
                name: $module::$ty::NAME,
                summary: $module::$ty::SUMMARY,
                options: <$module::$ty as FromOptions>::OPTIONS,
                create: |given| build::<$module::$ty>($module::$ty::NAME, given),
            },
        )*];
    };
}

declare_passes! {
    infer_shapes::InferShapes,
    simplify_shape_arith::SimplifyShapeArith,
    fold_batchnorm::FoldBatchnorm,
    integer_products::IntegerProducts,
    canonicalize::Canonicalize,
    fold_constants::FoldConstants,
    cse::Cse,
    dce::Dce,
    decompose::Decompose,
    widen_half::WidenHalf,
    layout::Layout,
    fuse::Fuse,
    schedule::Schedule,
    plan_memory::PlanMemory,
}

/// A named pipeline: a name that stands for pipeline text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamedPipeline {
    /// The name (`O2`, `cpu-default`).
    pub name: &'static str,
    /// What it is for (its doc comment).
    pub summary: &'static str,
    /// The pipeline text it stands for; may name other named pipelines.
    pub text: &'static str,
}

/// Declares the named pipelines; each row's doc comment is its summary.
macro_rules! declare_pipelines {
    ($( #[doc = $summary:literal] $name:literal = $text:literal, )*) => {
        static PIPELINES: &[NamedPipeline] = &[$(
            NamedPipeline { name: $name, summary: pass::trim_doc($summary), text: $text },
        )*];
    };
}

declare_pipelines! {
    /// No passes: the graph as imported.
    "O0" = "",
    /// One sweep of the cheap cleanups: shapes, shape arithmetic, algebraic identities, constants, CSE, dead code.
    "O1" = "infer-shapes,simplify-shape-arith,canonicalize,fold-constants,cse,dce",
    /// O1's cleanups, matmuls and convs of dequantized 8-bit operands made integer (before constant folding could turn dequantized weights into f32 constants) and batch-norm folding to a fixed point, half-precision arithmetic widened to f32, transposes sunk, fusion groups, schedule, memory plan.
    "O2" = "infer-shapes,fixpoint(simplify-shape-arith,canonicalize,integer-products,fold-constants,fold-batchnorm,cse,dce),widen-half,layout,fixpoint(canonicalize,cse,dce),fuse,schedule,plan-memory",
    /// For now the same as O2, so it also ends with schedule and plan-memory.
    "O3" = "O2",
    /// The CPU target's default; for now an alias of O2, so it ends with schedule and plan-memory.
    "cpu-default" = "O2",
    /// The CUDA target's default; for now an alias of O2 (target-specific passes come with codegen).
    "cuda-default" = "O2",
}

/// Every registered pass, in registry order.
pub fn passes() -> &'static [PassInfo] {
    PASSES
}

/// The pass called `name`.
pub fn pass_named(name: &str) -> Option<&'static PassInfo> {
    PASSES.iter().find(|p| p.name == name)
}

/// Every named pipeline, in registry order.
pub fn pipelines() -> &'static [NamedPipeline] {
    PIPELINES
}

/// The named pipeline called `name`.
pub fn pipeline_named(name: &str) -> Option<&'static NamedPipeline> {
    PIPELINES.iter().find(|p| p.name == name)
}

//! The pass manager: runs a [`Pipeline`] over a graph under [`Instrumentation`], and the crate's error type.
//!
//! [`PassManager::new`] expands named pipelines and builds every pass once; [`PassManager::run`] then walks the
//! steps, then runs the same steps over every control-flow body (`if` branches, loop bodies; see
//! `Run::regions`), so a region's body is optimized like any graph. The input graph is always verified first, so passes may assume a valid graph (a pass that breaks that
//! invariant is caught by `verify_each`, which every test turns on). A `fixpoint` group reruns its body until one
//! whole iteration changes nothing, and errors, naming the group, when its iteration cap is reached. On a pass
//! error or a verifier failure the manager writes a reproducer (the graph as it was before the failing pass and
//! the pipeline text) and names the file in the error.

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use kiln_ir::{Graph, VerifyError};

use crate::instrument::{Instrumentation, Reproducer, TimingReport, dump, write_reproducer};
use crate::pass::{OptionError, Pass, PassContext, PassError};
use crate::pass_named;
use crate::pipeline::{Pipeline, PipelineItem, PipelineParseError};

/// Errors of the passes crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Pipeline text did not parse.
    #[error(transparent)]
    Parse(#[from] PipelineParseError),
    /// A pipeline built in code names no registered pass or pipeline.
    #[error("unknown pass or pipeline `{0}`")]
    UnknownPass(String),
    /// A pipeline built in code gives a pass bad options.
    #[error("{0}")]
    Options(#[from] OptionError),
    /// The graph handed to the manager is invalid (no pass has run).
    #[error("the input graph has {} error(s):\n{}", .0.len(), list(.0))]
    InvalidInput(Vec<VerifyError>),
    /// A pass failed.
    #[error("{error}{reproducer}")]
    Pass {
        /// The error, naming the pass.
        error: PassError,
        /// Where the reproducer went.
        reproducer: ReproducerNote,
    },
    /// `verify_each` found errors after a pass.
    #[error("the graph fails verification after pass `{pass}` ({} error(s)):\n{}{reproducer}", errors.len(), list(errors))]
    Verify {
        /// The pass that ran last.
        pass: String,
        /// Every verifier error.
        errors: Vec<VerifyError>,
        /// Where the reproducer went.
        reproducer: ReproducerNote,
    },
    /// A fixpoint group still changed the graph in its last allowed iteration.
    #[error("fixpoint group `{group}` did not converge within {max_iterations} iterations")]
    NoFixpoint {
        /// The group, as pipeline text.
        group: String,
        /// Its iteration cap.
        max_iterations: usize,
    },
    /// Writing a dump or the timing table to the sink failed.
    #[error("writing pass instrumentation output: {0}")]
    Io(#[from] std::io::Error),
}

fn list(errors: &[VerifyError]) -> String {
    errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n")
}

/// What became of the reproducer of a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReproducerNote {
    /// Reproducers are off.
    Off,
    /// Written to this file.
    Written(PathBuf),
    /// Writing failed, for this reason.
    Failed(String),
}

impl ReproducerNote {
    /// The reproducer's path, if one was written.
    pub fn path(&self) -> Option<&PathBuf> {
        match self {
            ReproducerNote::Written(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for ReproducerNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReproducerNote::Off => Ok(()),
            ReproducerNote::Written(p) => write!(f, "\nreproducer (input IR and pipeline) written to {}", p.display()),
            ReproducerNote::Failed(e) => write!(f, "\ncould not write a reproducer: {e}"),
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Whether any pass changed the graph.
    pub changed: bool,
    /// Pass executions (each run of a pass in a fixpoint group counts).
    pub executions: usize,
    /// The last pass executed.
    pub last_pass: Option<String>,
    /// True when `bisect` stopped the run before the pipeline's end.
    pub stopped_by_bisect: bool,
    /// Per-pass timing, when `time_passes` was on.
    pub timing: Option<TimingReport>,
}

enum Step {
    Pass { pass: Box<dyn Pass>, text: String },
    Fixpoint { max_iterations: usize, group: String, body: Vec<Step> },
}

/// A pipeline ready to run. See the module docs.
pub struct PassManager {
    pipeline: Pipeline,
    steps: Vec<Step>,
}

impl fmt::Debug for PassManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PassManager").field("pipeline", &self.pipeline.to_string()).finish_non_exhaustive()
    }
}

fn build(p: &Pipeline) -> Result<Vec<Step>, Error> {
    p.items
        .iter()
        .map(|item| match item {
            PipelineItem::Pass { name, options } => {
                let info = pass_named(name).ok_or_else(|| Error::UnknownPass(name.clone()))?;
                Ok(Step::Pass { pass: info.create(options)?, text: item.to_string() })
            }
            PipelineItem::Named(name) => Err(Error::UnknownPass(name.clone())),
            PipelineItem::Fixpoint { max_iterations, body } => {
                Ok(Step::Fixpoint { max_iterations: *max_iterations, group: item.to_string(), body: build(body)? })
            }
        })
        .collect()
}

impl PassManager {
    /// Expands named pipelines and builds every pass.
    pub fn new(pipeline: &Pipeline) -> Result<PassManager, Error> {
        Ok(PassManager { pipeline: pipeline.clone(), steps: build(&pipeline.expand())? })
    }

    /// Parses pipeline text and builds it.
    pub fn parse(text: &str) -> Result<PassManager, Error> {
        PassManager::new(&Pipeline::parse(text)?)
    }

    /// A manager over passes built in code (custom passes of tools and tests), run in order. Its pipeline text,
    /// used in reproducers, lists their names.
    pub fn from_passes(passes: Vec<Box<dyn Pass>>) -> PassManager {
        let item = |p: &dyn Pass| PipelineItem::Pass { name: p.name().to_string(), options: Vec::new() };
        let pipeline = Pipeline { items: passes.iter().map(|p| item(p.as_ref())).collect() };
        let steps = passes.into_iter().map(|pass| Step::Pass { text: pass.name().to_string(), pass }).collect();
        PassManager { pipeline, steps }
    }

    /// The pipeline, as given (named pipelines unexpanded).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Runs the pipeline over `g`. On error `g` holds whatever the passes had done; a reproducer holds the graph
    /// as it was before the failing pass.
    pub fn run(&self, g: &mut Graph, cx: &PassContext, inst: &mut Instrumentation<'_>) -> Result<RunReport, Error> {
        kiln_ir::verify(g).map_err(Error::InvalidInput)?;
        let mut run = Run {
            inst,
            cx,
            pipeline: self.pipeline.to_string(),
            report: RunReport::default(),
            timing: TimingReport::default(),
        };
        run.report.changed = run.steps(&self.steps, g)?;
        run.report.changed |= run.regions(&self.steps, g)?;
        if let (Some(n), true) = (run.inst.bisect, run.report.stopped_by_bisect) {
            let last = run.report.last_pass.as_deref().unwrap_or("(none)");
            run.inst.emit(&format!("// bisect: stopped after {n} pass execution(s); the last was `{last}`\n"))?;
        }
        if run.inst.time_passes {
            run.inst.emit(&run.timing.render())?;
            run.report.timing = Some(run.timing);
        }
        Ok(run.report)
    }
}

struct Run<'r, 'a> {
    inst: &'r mut Instrumentation<'a>,
    cx: &'r PassContext,
    pipeline: String,
    report: RunReport,
    timing: TimingReport,
}

impl Run<'_, '_> {
    /// Runs `steps`; says whether any changed the graph. Returns early once bisect stops the run.
    fn steps(&mut self, steps: &[Step], g: &mut Graph) -> Result<bool, Error> {
        let mut changed = false;
        for step in steps {
            if self.report.stopped_by_bisect {
                break;
            }
            changed |= match step {
                Step::Pass { pass, text } => self.pass(pass.as_ref(), text, g)?,
                Step::Fixpoint { max_iterations, group, body } => self.fixpoint(*max_iterations, group, body, g)?,
            };
        }
        Ok(changed)
    }

    /// Runs `steps` over the bodies of every control-flow node (`if` branches, loop bodies) of `g`, innermost
    /// regions last, after the enclosing graph's pipeline (which typed the bodies' inputs); says whether any
    /// changed. A body keeps its interface (inputs and results), so `g`'s memory plan stays valid.
    fn regions(&mut self, steps: &[Step], g: &mut Graph) -> Result<bool, Error> {
        let ids: Vec<kiln_ir::NodeId> =
            g.node_ids().filter(|&id| matches!(g.node(id).op, kiln_ir::Op::If(_) | kiln_ir::Op::Loop(_))).collect();
        if ids.is_empty() {
            return Ok(false);
        }
        let plan = g.memory_plan().cloned();
        let mut changed = false;
        for id in ids {
            let mut op = g.node(id).op.clone();
            let mut this = false;
            for body in op.bodies_mut() {
                this |= self.steps(steps, &mut body.0)?;
                this |= self.regions(steps, &mut body.0)?;
            }
            if this {
                *g.node_mut(id).op = op;
                changed = true;
            }
        }
        g.set_memory_plan(plan);
        Ok(changed)
    }

    fn fixpoint(&mut self, max_iterations: usize, group: &str, body: &[Step], g: &mut Graph) -> Result<bool, Error> {
        let mut changed = false;
        for _ in 0..max_iterations {
            let this = self.steps(body, g)?;
            changed |= this;
            if !this || self.report.stopped_by_bisect {
                return Ok(changed);
            }
        }
        Err(Error::NoFixpoint { group: group.to_string(), max_iterations })
    }

    fn pass(&mut self, pass: &dyn Pass, text: &str, g: &mut Graph) -> Result<bool, Error> {
        let name = pass.name();
        if self.inst.bisect.is_some_and(|n| self.report.executions >= n) {
            self.report.stopped_by_bisect = true;
            return Ok(false);
        }
        if self.inst.print_before.contains(name) {
            self.inst.emit(&dump("Before", name, g))?;
        }
        let input = (self.inst.reproducer != Reproducer::Off).then(|| g.clone());
        let start = Instant::now();
        let result = pass.run(g, self.cx);
        self.timing.record(name, start.elapsed());
        self.report.executions += 1;
        self.report.last_pass = Some(name.to_string());
        if self.inst.bisect.is_some() {
            self.inst.emit(&format!("// bisect: ran pass ({}) {name}\n", self.report.executions))?;
        }
        let changed = match result {
            Ok(c) => c,
            Err(error) => {
                let reproducer = self.reproduce(text, &error.to_string(), input.as_ref());
                return Err(Error::Pass { error, reproducer });
            }
        };
        if self.inst.verify_each
            && let Err(errors) = kiln_ir::verify(g)
        {
            let what = format!("the graph fails verification after pass `{name}`");
            let reproducer = self.reproduce(text, &what, input.as_ref());
            return Err(Error::Verify { pass: name.to_string(), errors, reproducer });
        }
        if self.inst.prints_after(name, changed) {
            self.inst.emit(&dump("After", name, g))?;
        }
        Ok(changed)
    }

    fn reproduce(&self, pass: &str, what: &str, input: Option<&Graph>) -> ReproducerNote {
        let (dir, input) = match (&self.inst.reproducer, input) {
            (Reproducer::Off, _) | (_, None) => return ReproducerNote::Off,
            (Reproducer::TempDir, Some(g)) => (std::env::temp_dir(), g),
            (Reproducer::Dir(d), Some(g)) => (d.clone(), g),
        };
        // Only the first line of the failure goes into the header comment.
        let what = what.lines().next().unwrap_or_default();
        match write_reproducer(&dir, &self.pipeline, pass, what, input) {
            Ok(p) => ReproducerNote::Written(p),
            Err(e) => ReproducerNote::Failed(format!("{}: {e}", dir.display())),
        }
    }
}

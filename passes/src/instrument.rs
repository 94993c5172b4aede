//! Instrumentation of a pipeline run: IR dumps, pass timing, verification after each pass, bisection and failure
//! reproducers — the flags of `kiln opt`, modelled on MLIR's (`-mlir-print-ir-after-change`, `-mlir-timing`,
//! `-verify-each`, crash reproducers).
//!
//! [`Instrumentation`] is plain configuration; the manager reads it. Dumps go to the configured sink (the CLI
//! passes stderr) and look like MLIR's: a `// -----// IR Dump After cse //----- //` line, then the `.kir` text.
//! Passes never dump or verify themselves.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_ir::Graph;

/// Which passes a print option applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PassSelection {
    /// None.
    #[default]
    None,
    /// Every pass.
    All,
    /// The passes with these names.
    Passes(BTreeSet<String>),
}

impl PassSelection {
    /// The passes named in `names`.
    pub fn passes<S: Into<String>>(names: impl IntoIterator<Item = S>) -> PassSelection {
        PassSelection::Passes(names.into_iter().map(Into::into).collect())
    }

    /// Whether `pass` is selected.
    pub fn contains(&self, pass: &str) -> bool {
        match self {
            PassSelection::None => false,
            PassSelection::All => true,
            PassSelection::Passes(names) => names.contains(pass),
        }
    }

    /// True for [`PassSelection::None`].
    pub fn is_none(&self) -> bool {
        matches!(self, PassSelection::None)
    }
}

/// Where the failure reproducer goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Reproducer {
    /// Into [`std::env::temp_dir`].
    #[default]
    TempDir,
    /// Into this directory.
    Dir(PathBuf),
    /// Not written.
    Off,
}

/// How to instrument a run. The default verifies nothing, prints nothing, and writes reproducers to the temp dir.
#[derive(Default)]
pub struct Instrumentation<'a> {
    /// Dump the graph before these passes.
    pub print_before: PassSelection,
    /// Dump the graph after these passes.
    pub print_after: PassSelection,
    /// Dump after a pass only when it changed the graph. With `print_after` of `None`, this alone dumps after
    /// every pass that changed the graph (`--print-after-change`); otherwise it filters `print_after`.
    pub print_after_change: bool,
    /// Collect wall time and call counts per pass, and write the table to the sink at the end.
    pub time_passes: bool,
    /// Run `kiln_ir::verify` on the input and after every pass; a failure is an error naming the pass.
    pub verify_each: bool,
    /// Stop after this many pass executions (counting each run of a pass inside a fixpoint group).
    pub bisect: Option<usize>,
    /// Where a pass failure writes the input IR and the pipeline.
    pub reproducer: Reproducer,
    /// Where dumps, bisect notes and the timing table go; `None` means stderr.
    pub sink: Option<&'a mut dyn Write>,
}

impl Instrumentation<'_> {
    /// Whether to dump after `pass`, which did or did not change the graph.
    pub fn prints_after(&self, pass: &str, changed: bool) -> bool {
        let selected = self.print_after.contains(pass) || (self.print_after_change && self.print_after.is_none());
        selected && (changed || !self.print_after_change)
    }

    /// Writes `text` to the sink (stderr when none is set).
    pub(crate) fn emit(&mut self, text: &str) -> std::io::Result<()> {
        match &mut self.sink {
            Some(w) => w.write_all(text.as_bytes()),
            None => std::io::stderr().write_all(text.as_bytes()),
        }
    }
}

/// An MLIR-style dump header and the graph's `.kir` text.
pub fn dump(when: &str, pass: &str, g: &Graph) -> String {
    format!("// -----// IR Dump {when} {pass} //----- //\n{}\n", kiln_ir::print(g))
}

/// Wall time and call count of one pass over a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimingRow {
    /// The pass's name.
    pub pass: String,
    /// How many times it ran.
    pub calls: usize,
    /// Total wall time.
    pub wall: Duration,
}

/// Per-pass timing of a run, in the order passes first ran.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimingReport {
    /// One row per pass.
    pub rows: Vec<TimingRow>,
}

impl TimingReport {
    /// Adds one execution of `pass`.
    pub fn record(&mut self, pass: &str, wall: Duration) {
        match self.rows.iter_mut().find(|r| r.pass == pass) {
            Some(r) => {
                r.calls += 1;
                r.wall += wall;
            }
            None => self.rows.push(TimingRow { pass: pass.to_string(), calls: 1, wall }),
        }
    }

    /// Total wall time over all passes.
    pub fn total(&self) -> Duration {
        self.rows.iter().map(|r| r.wall).sum()
    }

    /// The table `--time-passes` prints.
    pub fn render(&self) -> String {
        let total = self.total();
        let mut out = String::from("===-------------------------------------------------------------------------===\n");
        out += "                          Pass execution timing report\n";
        out += "===-------------------------------------------------------------------------===\n";
        out += &format!("  Total Execution Time: {:.6} seconds\n\n", total.as_secs_f64());
        out += "   Wall Time (s)   Share   Calls  Pass\n";
        for r in &self.rows {
            let share = if total.is_zero() { 0.0 } else { 100.0 * r.wall.as_secs_f64() / total.as_secs_f64() };
            out += &format!("  {:>14.6}  {:>5.1}%  {:>6}  {}\n", r.wall.as_secs_f64(), share, r.calls, r.pass);
        }
        out += &format!(
            "  {:>14.6}  100.0%  {:>6}  Total\n",
            total.as_secs_f64(),
            self.rows.iter().map(|r| r.calls).sum::<usize>()
        );
        out
    }
}

/// Writes a reproducer for a failure of `pass`: a `.kir` file whose header comments give the pipeline and the
/// failing pass, followed by the graph as it was before that pass. Returns its path.
pub fn write_reproducer(dir: &Path, pipeline: &str, pass: &str, what: &str, input: &Graph) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let text = format!(
        "// kiln pass failure reproducer: {what}\n// pipeline: {pipeline}\n// failing pass: {pass}\n// \
         reproduce with: kiln opt THIS_FILE --pipeline '{pass}'\n{}",
        kiln_ir::print(input)
    );
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    for attempt in 0u32.. {
        let path = dir.join(format!("kiln-reproducer-{}-{stamp}-{attempt}.kir", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(text.as_bytes())?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 1000 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free reproducer file name"))
}

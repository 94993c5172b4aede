//! `kiln conformance`: ONNX backend node tests, one line per case and a closing count.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln::Backend;
use kiln::conformance::{Outcome, cases, run_case};

/// Arguments of `kiln conformance`.
#[derive(Args, Debug)]
pub struct ConformanceArgs {
    /// A folder of case folders (each with model.onnx and test_data_set_*/).
    dir: PathBuf,
    /// The executor.
    #[arg(long, default_value = "interp", value_parser = |s: &str| s.parse::<Backend>())]
    backend: Backend,
    /// Run only cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Print one JSON object per case instead of text, then the summary object.
    #[arg(long)]
    json: bool,
    /// Fail (exit 1) if fewer than this many cases pass, as well as on any failed case.
    #[arg(long, value_name = "N")]
    min_passed: Option<usize>,
}

pub fn run(a: ConformanceArgs) -> Result<()> {
    let all = cases(&a.dir, a.filter.as_deref()).with_context(|| format!("cannot read {}", a.dir.display()))?;
    if all.is_empty() {
        bail!("no case folders (with model.onnx) under {}", a.dir.display());
    }
    let (mut passed, mut failed, mut unsupported) = (0usize, 0usize, 0usize);
    for dir in &all {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let outcome = run_case(dir, a.backend);
        let (status, detail) = match &outcome {
            Outcome::Passed => {
                passed += 1;
                ("passed", "")
            }
            Outcome::Failed(m) => {
                failed += 1;
                ("FAILED", m.as_str())
            }
            Outcome::Unsupported(m) => {
                unsupported += 1;
                ("unsupported", m.as_str())
            }
        };
        if a.json {
            println!("{}", serde_json::json!({"case": name, "status": status.to_lowercase(), "detail": detail}));
        } else if detail.is_empty() {
            println!("{status:<11} {name}");
        } else {
            println!("{status:<11} {name}: {detail}");
        }
    }
    if a.json {
        println!("{}", serde_json::json!({"passed": passed, "failed": failed, "unsupported": unsupported}));
    } else {
        println!("{passed} passed, {failed} failed, {unsupported} unsupported");
    }
    if failed > 0 {
        bail!("{failed} case(s) failed");
    }
    if let Some(floor) = a.min_passed
        && passed < floor
    {
        bail!("only {passed} cases passed; the recorded floor is {floor}");
    }
    Ok(())
}

//! `kiln backends`: the backend registry as a run would see it — the built-in backends plus the plugins listed
//! in `KILN_BACKEND_PLUGINS` — one line per backend, best first.

use anyhow::{Context, Result};
use clap::Args;
use kiln_runtime::registry::{BackendRegistry, PLUGINS_ENV_VAR};

/// Arguments of `kiln backends`.
#[derive(Args, Debug)]
pub struct BackendsArgs {}

pub fn run(_a: BackendsArgs) -> Result<()> {
    let mut registry = BackendRegistry::with_defaults();
    registry.load_plugins_from_env().with_context(|| format!("loading the plugins in {PLUGINS_ENV_VAR}"))?;
    for line in registry.describe() {
        println!("{line}");
    }
    Ok(())
}

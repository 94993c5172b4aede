//! Logging for kiln's command-line tools. Libraries (this crate, the compiler crates) emit `tracing` events —
//! placement decisions, interpreter fallbacks, plugin loads, prefix-cache hits and misses, artifact loads — and
//! never print; a binary installs a subscriber with [`init_cli`] (feature `cli`).
//!
//! Levels: warnings by default (`-q`: errors only; `-v`: info, `-vv`: debug, `-vvv`: trace). `KILN_LOG`, when
//! set, replaces that with a `tracing-subscriber` filter (`KILN_LOG=kiln_runtime=debug,info`). Events go to
//! stderr, so they never mix with a command's output on stdout.

/// The environment variable holding a log filter.
pub const LOG_ENV_VAR: &str = "KILN_LOG";

/// The logging options every kiln command line takes (flattened into each CLI's top-level arguments).
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct LogArgs {
    /// More log output on stderr: -v info (placement, fallbacks, plugin loads, cache decisions), -vv debug,
    /// -vvv trace. `KILN_LOG` (a tracing filter such as `kiln_runtime=debug`) overrides -v and -q.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
}

#[cfg(feature = "cli")]
impl LogArgs {
    /// Installs the subscriber these options ask for ([`init_cli`]).
    pub fn init(&self) -> Result<(), String> {
        init_cli(self.verbose, self.quiet)
    }
}

/// Installs the stderr subscriber for `verbose` (`-v` count) and `quiet`, unless `KILN_LOG` gives a filter. A
/// malformed `KILN_LOG` is an error naming it. Calling it twice keeps the first subscriber.
#[cfg(feature = "cli")]
pub fn init_cli(verbose: u8, quiet: bool) -> Result<(), String> {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var(LOG_ENV_VAR) {
        Ok(spec) if !spec.trim().is_empty() => {
            EnvFilter::try_new(&spec).map_err(|e| format!("{LOG_ENV_VAR}=`{spec}` is not a log filter: {e}"))?
        }
        _ => EnvFilter::new(match (quiet, verbose) {
            (true, _) => "error",
            (false, 0) => "warn",
            (false, 1) => "info",
            (false, 2) => "debug",
            (false, _) => "trace",
        }),
    };
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_target(verbose >= 2)
        .without_time()
        .try_init();
    Ok(())
}

//! The `kiln` command-line tool: `run`, `opt`, `inspect`.
//!
//! Every user error becomes one readable line on stderr and an exit code by its kind (`cli::exit_code`: 3 could
//! not read, 4 unsupported, 5 invalid input, 1 anything else; usage errors: 2, from clap). A panic is a kiln bug;
//! the hook turns it into a one-line report instead of a backtrace.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc keeps freed memory for reuse (and returns it to the system after a second idle), where glibc's
/// `malloc` gives every block over 32 MiB back to the system on `free`: a model whose outputs or per-run buffers
/// are that large would otherwise fault every page in again on every run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Output piped into a command that stops reading (`kiln inspect … | head`) ends kiln quietly, as it does any
    // Unix tool, instead of failing a `println!`.
    #[cfg(unix)]
    // SAFETY: restoring the default action of SIGPIPE before any thread starts or any I/O happens.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("internal error: {msg}{at}\nthis is a bug in kiln; please report it with the command that caused it");
    }));
    let args = cli::Cli::parse();
    match cli::dispatch(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(cli::exit_code(&e))
        }
    }
}

//! The hostile-input regression corpus (`tests/hostile/cases.txt` and the files beside it): every case runs through
//! the `kiln` CLI as a user would and must end with exit code 1 and one `error:` line saying what the case expects
//! — never a signal, an abort, a panic, a hang or a wrong answer with exit 0. See `tests/hostile/cases.txt` for
//! the format; add a case there (and its file) for every hostile input found. A `conformance` case may say what
//! it expects on the `FAILED` line of its case (stdout) instead.

use std::path::Path;
use std::process::Command;

#[test]
fn every_hostile_case_is_one_clear_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile");
    let cases = std::fs::read_to_string(dir.join("cases.txt")).expect("tests/hostile/cases.txt");
    let out = tempfile::tempdir().unwrap();
    let mut ran = 0;
    let mut problems = Vec::new();
    for (n, line) in cases.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.splitn(3, " | ").collect();
        let [family, args, expected] = fields[..] else {
            panic!("cases.txt:{}: expected `family | args | error`", n + 1)
        };
        let args =
            args.replace("{dir}", dir.to_str().unwrap()).replace("{out}", out.path().join("o").to_str().unwrap());
        let mut words = args.split_whitespace().peekable();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.env_remove("KILN_BACKEND_PLUGINS").env_remove("KILN_LOG").env_remove("KILN_MAX_THREADS");
        while let Some((k, v)) = words
            .peek()
            .and_then(|w| w.split_once('='))
            .filter(|(k, _)| k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        {
            cmd.env(k, v);
            words.next();
        }
        cmd.args(words);
        let o = cmd.output().expect("the kiln binary runs");
        let err = String::from_utf8_lossy(&o.stderr);
        let first = err.lines().next().unwrap_or("");
        let one_error = first.starts_with("error: ") && err.lines().skip(1).all(|l| l.starts_with("  "));
        let clean = !err.contains("panicked") && !err.contains("internal error") && !err.contains("RUST_BACKTRACE");
        // `conformance` reports each case on stdout (`FAILED name: why`) and the count as its error.
        let said = err.contains(expected) || (args.starts_with("conformance") && stdout_has(&o.stdout, expected));
        // Exit 1, or 3–5 by the error's kind (docs/cli.md): never 0, 2 (usage) or a signal.
        let user_error = matches!(o.status.code(), Some(1 | 3 | 4 | 5));
        if !user_error || !one_error || !clean || !said {
            problems.push(format!(
                "cases.txt:{} [{family}] `{args}`: exit {:?}, stderr:\n{err}(expected one error saying `{expected}`)",
                n + 1,
                o.status.code()
            ));
        }
        ran += 1;
    }
    assert!(ran >= 50, "the corpus should hold its cases ({ran} ran)");
    assert!(problems.is_empty(), "{} of {ran} hostile cases misbehaved:\n{}", problems.len(), problems.join("\n"));
}

fn stdout_has(stdout: &[u8], expected: &str) -> bool {
    String::from_utf8_lossy(stdout).lines().any(|l| l.starts_with("FAILED") && l.contains(expected))
}

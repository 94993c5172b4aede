//! Filetests: `.kir` cases in `tests/filetests/<pass-or-pipeline>/<case>.kir` at the repository root, each file
//! opening with a `// RUN: <pipeline>` line and holding cases split by `// -----` lines. Every case runs through
//! its file's pipeline with `verify_each` on, and the printed result (or the error) is an insta snapshot named
//! `<file-stem>-<index>@<pipeline>` beside this harness, with the input as the snapshot's description. Bless
//! changed output with `INSTA_UPDATE=always cargo test -p kiln-passes --test filetests` and review the diff.

use std::path::{Path, PathBuf};

use kiln_passes::{Instrumentation, PassContext, PassManager, Reproducer};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/filetests")
}

/// One file's pipeline and cases.
struct FileTest {
    stem: String,
    pipeline: String,
    cases: Vec<String>,
}

fn read(path: &Path) -> FileTest {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let pipeline = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("// RUN:"))
        .unwrap_or_else(|| panic!("{}: the first line must be `// RUN: <pipeline>`", path.display()))
        .trim()
        .to_string();
    let mut cases = vec![String::new()];
    for line in text.lines().skip(1) {
        if line.trim() == "// -----" {
            cases.push(String::new());
        } else {
            let case = cases.last_mut().expect("at least one case");
            case.push_str(line);
            case.push('\n');
        }
    }
    let stem = path.file_stem().expect("file stem").to_string_lossy().into_owned();
    FileTest { stem, pipeline, cases }
}

/// The pipeline's output for one case: the printed graph and the types of its weights, or the error.
fn run_case(pipeline: &str, input: &str) -> String {
    let mut g = match kiln_ir::parse(input) {
        Ok(g) => g,
        Err(e) => panic!("case does not parse:\n{e}\n{input}"),
    };
    let pm = PassManager::parse(pipeline).unwrap_or_else(|e| panic!("{e}"));
    let mut inst = Instrumentation { verify_each: true, reproducer: Reproducer::Off, ..Default::default() };
    match pm.run(&mut g, &PassContext::default(), &mut inst) {
        Ok(_) => {
            let mut out = kiln_ir::print(&g);
            for (name, w) in g.weights.iter() {
                out += &format!("// weight {name:?}: {}\n", w.tensor_type());
            }
            out
        }
        Err(e) => format!("error: {e}\n"),
    }
}

fn files() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(root()).expect("tests/filetests exists") {
        let dir = dir.expect("dir entry").path();
        if !dir.is_dir() {
            continue;
        }
        let group = dir.file_name().expect("name").to_string_lossy().into_owned();
        for f in std::fs::read_dir(&dir).expect("readable") {
            let f = f.expect("dir entry").path();
            if f.extension().is_some_and(|e| e == "kir") {
                out.push((group.clone(), f));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn filetests() {
    let mut ran = 0;
    for (_, path) in files() {
        let test = read(&path);
        for (i, case) in test.cases.iter().enumerate() {
            let name = format!("{}-{i}@{}", test.stem, test.pipeline);
            let output = run_case(&test.pipeline, case);
            insta::with_settings!({ description => case.trim_end(), omit_expression => true }, {
                insta::assert_snapshot!(name, output);
            });
            ran += 1;
        }
    }
    assert!(ran > 0, "no filetests found under {}", root().display());
}

#[test]
fn every_pass_and_level_has_filetests() {
    let files = files();
    let mut missing = Vec::new();
    let mut want: Vec<(&str, usize)> = kiln_passes::passes().iter().map(|p| (p.name, 5)).collect();
    want.extend([("O1", 1), ("O2", 1)]);
    for (group, min) in want {
        let cases: usize = files.iter().filter(|(g, _)| g == group).map(|(_, p)| read(p).cases.len()).sum();
        if cases < min {
            missing.push(format!("{group}: {cases} case(s), want at least {min}"));
        }
    }
    for (group, _) in &files {
        let known = kiln_passes::pass_named(group).is_some() || kiln_passes::pipeline_named(group).is_some();
        assert!(known, "tests/filetests/{group} names no registered pass or pipeline");
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

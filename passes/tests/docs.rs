//! `docs/passes.md` is generated from the registry: this test renders it and fails when the file differs.
//! Regenerate with `KILN_BLESS_DOCS=1 cargo test -p kiln-passes --test docs`.

use std::path::PathBuf;

fn render() -> String {
    let mut out = String::from(
        "# Passes and pipelines\n\n\
         <!-- Generated from the registry in `passes/src/lib.rs` by the test `passes_md_is_up_to_date`\n\
         (`passes/tests/docs.rs`). Do not edit by hand: regenerate with\n\
         `KILN_BLESS_DOCS=1 cargo test -p kiln-passes --test docs`. -->\n\n\
         A pipeline is text: pass and pipeline names separated by commas, options in braces, and `fixpoint(...)`\n\
         groups that rerun until an iteration changes nothing (`fixpoint{max-iterations=N}(...)`, default 16;\n\
         reaching the cap is an error naming the group). Example:\n\
         `canonicalize,cse,fixpoint(fold-constants,dce),fold-constants{max-elements=1024}`. The grammar is in\n\
         `passes/src/pipeline.rs`; how to add a pass is in [adding-a-pass.md](adding-a-pass.md).\n\n\
         ## Passes\n\n\
         | pass | what it does | options |\n| --- | --- | --- |\n",
    );
    for p in kiln_passes::passes() {
        let options = if p.options.is_empty() {
            "—".to_string()
        } else {
            p.options.iter().map(|o| format!("`{}={}`: {}", o.name, o.value, o.summary)).collect::<Vec<_>>().join("; ")
        };
        out += &format!("| `{}` | {} | {} |\n", p.name, p.summary, options);
    }
    out += "\n## Named pipelines\n\nA named pipeline may stand wherever a pass name may (`canonicalize,O1`); it \
            takes no options.\n\n| name | pipeline | what it is for |\n| --- | --- | --- |\n";
    for p in kiln_passes::pipelines() {
        let text = if p.text.is_empty() { "(empty)".to_string() } else { format!("`{}`", p.text) };
        out += &format!("| `{}` | {} | {} |\n", p.name, text, p.summary);
    }
    out += "\n## Instrumentation\n\n\
            `kiln_passes::Instrumentation` configures a run (`PassManager::run`); dumps go to its `sink` (stderr by \
            default) as `// -----// IR Dump After cse //----- //` followed by the `.kir` text.\n\n\
            | field | effect |\n| --- | --- |\n\
            | `print_before`, `print_after` | dump before / after the selected passes (`PassSelection::All` or by name) |\n\
            | `print_after_change` | dump only after passes that changed the graph; alone, after every such pass |\n\
            | `time_passes` | wall time and call count per pass, written as a table at the end and returned |\n\
            | `verify_each` | run `kiln_ir::verify` after every pass; a failure names the pass and lists every error |\n\
            | `bisect` | stop after N pass executions; the report (and the sink) name the last pass run |\n\
            | `reproducer` | on a pass error or verify failure, write the graph as it was before that pass and the \
            pipeline text to a `.kir` file (temp dir by default) and name it in the error |\n";
    out
}

#[test]
fn passes_md_is_up_to_date() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/passes.md");
    let want = render();
    if std::env::var_os("KILN_BLESS_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/passes.md is out of date with the pass registry; regenerate it with\n  \
         KILN_BLESS_DOCS=1 cargo test -p kiln-passes --test docs\n--- expected ---\n{want}"
    );
}

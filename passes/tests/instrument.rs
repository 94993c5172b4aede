//! Instrumentation: dumps before/after passes and only on change, the timing table, verify-each, bisect, fixpoint
//! caps, and the failure reproducer.

use kiln_ir::{Graph, Op, parse};
use kiln_passes::{
    Error, Instrumentation, Pass, PassContext, PassError, PassManager, PassSelection, Reproducer, RunReport,
};

/// `x` feeds a dead `exp` and a duplicated `relu`: dce and cse each change it once; canonicalize never does.
const GRAPH: &str = r#"graph "g" {
  %x = input {name="x"} : f32[4]
  %dead = exp %x : f32[4]
  %a = relu %x : f32[4]
  %b = relu %x : f32[4]
  %s = add %a, %b : f32[4]
  output "s" = %s
}
"#;

fn graph() -> Graph {
    parse(GRAPH).expect("the test graph parses")
}

/// Runs `pipeline` over [`GRAPH`], returning the report (or error) and what went to the sink.
fn run_with(pipeline: &str, configure: impl FnOnce(&mut Instrumentation<'_>)) -> (Result<RunReport, Error>, String) {
    let mut sink = Vec::new();
    let result = {
        let mut inst = Instrumentation { sink: Some(&mut sink), reproducer: Reproducer::Off, ..Default::default() };
        configure(&mut inst);
        PassManager::parse(pipeline).expect("pipeline parses").run(&mut graph(), &PassContext::default(), &mut inst)
    };
    (result, String::from_utf8(sink).expect("dumps are UTF-8"))
}

#[test]
fn print_after_change_prints_only_for_passes_that_changed_the_graph() {
    let (r, out) = run_with("canonicalize,dce,canonicalize,cse", |i| i.print_after_change = true);
    r.unwrap();
    assert!(out.contains("// -----// IR Dump After dce //----- //\ngraph \"g\" {"), "{out}");
    assert!(out.contains("// -----// IR Dump After cse //----- //"), "{out}");
    assert!(!out.contains("After canonicalize"), "{out}");
    assert_eq!(out.matches("IR Dump").count(), 2, "{out}");
}

#[test]
fn print_after_change_filters_a_print_after_selection() {
    let (r, out) = run_with("dce,cse,dce", |i| {
        i.print_after = PassSelection::passes(["dce"]);
        i.print_after_change = true;
    });
    r.unwrap();
    // The first dce changes the graph, the second does not; cse is not selected.
    assert_eq!(out.matches("IR Dump After dce").count(), 1, "{out}");
    assert!(!out.contains("After cse"), "{out}");
}

#[test]
fn print_before_and_after_named_passes_and_all() {
    let (r, out) = run_with("dce,cse", |i| {
        i.print_before = PassSelection::passes(["cse"]);
        i.print_after = PassSelection::passes(["dce"]);
    });
    r.unwrap();
    let before = out.find("IR Dump Before cse").expect("before cse");
    let after = out.find("IR Dump After dce").expect("after dce");
    assert!(after < before, "{out}");
    assert_eq!(out.matches("IR Dump").count(), 2, "{out}");

    let (r, out) = run_with("O1", |i| i.print_after = PassSelection::All);
    r.unwrap();
    for pass in ["infer-shapes", "canonicalize", "fold-constants", "cse", "dce"] {
        assert!(out.contains(&format!("// -----// IR Dump After {pass} //----- //")), "{pass}:\n{out}");
    }
}

#[test]
fn the_dump_is_the_printed_graph() {
    let (r, out) = run_with("dce", |i| i.print_after = PassSelection::All);
    r.unwrap();
    let mut g = graph();
    kiln_passes::dce::remove_dead(&mut g);
    assert_eq!(out, format!("// -----// IR Dump After dce //----- //\n{}\n", kiln_ir::print(&g)));
}

/// A fixed pipeline for the counting tests (O2's text grows as passes are added; these counts should not).
const CLEANUP_FIXPOINT: &str = "infer-shapes,fixpoint(canonicalize,fold-constants,cse,dce)";

#[test]
fn time_passes_lists_every_pass_with_call_counts() {
    let (r, out) = run_with(CLEANUP_FIXPOINT, |i| i.time_passes = true);
    let report = r.unwrap();
    let timing = report.timing.expect("timing collected");
    let names: Vec<&str> = timing.rows.iter().map(|r| r.pass.as_str()).collect();
    assert_eq!(names, ["infer-shapes", "canonicalize", "fold-constants", "cse", "dce"]);
    // The fixpoint group runs twice: once changing (cse, dce), once to see nothing change.
    let calls: Vec<usize> = timing.rows.iter().map(|r| r.calls).collect();
    assert_eq!(calls, [1, 2, 2, 2, 2]);
    assert_eq!(report.executions, 9);
    assert!(out.contains("Pass execution timing report"), "{out}");
    for name in names {
        assert!(out.lines().any(|l| l.ends_with(&format!("  {name}"))), "{name} missing from:\n{out}");
    }
    assert!(out.contains("Total"), "{out}");
}

#[test]
fn bisect_stops_after_n_executions_and_names_the_last_pass() {
    for (n, last) in [(1, "infer-shapes"), (3, "fold-constants"), (7, "fold-constants")] {
        let (r, out) = run_with(CLEANUP_FIXPOINT, |i| i.bisect = Some(n));
        let report = r.unwrap();
        assert_eq!(report.executions, n);
        assert_eq!(report.last_pass.as_deref(), Some(last));
        assert!(report.stopped_by_bisect);
        assert!(out.contains(&format!("stopped after {n} pass execution(s); the last was `{last}`")), "{out}");
    }
    let (r, _) = run_with(CLEANUP_FIXPOINT, |i| i.bisect = Some(100));
    let report = r.unwrap();
    assert!(!report.stopped_by_bisect);
    assert_eq!(report.executions, 9);
}

/// A pass that fails, for the reproducer.
struct Fails;

impl Pass for Fails {
    fn name(&self) -> &'static str {
        "always-fails"
    }
    fn summary(&self) -> &'static str {
        "Fails."
    }
    fn run(&self, _: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        Err(PassError { pass: "always-fails", node: None, message: "it always does".into() })
    }
}

/// A pass that breaks the graph (removes every `relu`, leaving dangling operands).
struct Breaks;

impl Pass for Breaks {
    fn name(&self) -> &'static str {
        "break-graph"
    }
    fn summary(&self) -> &'static str {
        "Breaks the graph."
    }
    fn run(&self, g: &mut Graph, _: &PassContext) -> Result<bool, PassError> {
        let relus: Vec<_> = g.node_ids().filter(|&id| matches!(g.node(id).op, Op::Unary(_))).collect();
        for id in relus {
            g.remove_node(id);
        }
        Ok(true)
    }
}

#[test]
fn a_failing_pass_writes_a_reproducer_with_the_input_ir_and_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let pm =
        PassManager::from_passes(vec![kiln_passes::pass_named("dce").unwrap().create(&[]).unwrap(), Box::new(Fails)]);
    let mut g = graph();
    let mut inst = Instrumentation { reproducer: Reproducer::Dir(dir.path().into()), ..Default::default() };
    let err = pm.run(&mut g, &PassContext::default(), &mut inst).unwrap_err();
    let Error::Pass { error, reproducer } = &err else { panic!("{err}") };
    assert_eq!(error.pass, "always-fails");
    let path = reproducer.path().expect("a reproducer was written");
    assert!(path.starts_with(dir.path()));
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains("// pipeline: dce,always-fails"), "{text}");
    // The input of the failing pass: after dce, so without the dead exp.
    let mut expected = graph();
    kiln_passes::dce::remove_dead(&mut expected);
    assert!(text.ends_with(&kiln_ir::print(&expected)), "{text}");
    // It parses as .kir again (the header is comments).
    assert_eq!(kiln_ir::print(&parse(&text).unwrap()), kiln_ir::print(&expected));
}

#[test]
fn verify_each_names_the_pass_and_lists_the_verifier_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pm = PassManager::from_passes(vec![Box::new(Breaks)]);
    let mut inst =
        Instrumentation { verify_each: true, reproducer: Reproducer::Dir(dir.path().into()), ..Default::default() };
    let err = pm.run(&mut graph(), &PassContext::default(), &mut inst).unwrap_err();
    let Error::Verify { pass, errors, reproducer } = &err else { panic!("{err}") };
    assert_eq!(pass, "break-graph");
    assert!(errors.len() >= 2, "{errors:?}");
    let msg = err.to_string();
    assert!(msg.contains("after pass `break-graph`") && msg.contains("not in the graph"), "{msg}");
    let text = std::fs::read_to_string(reproducer.path().expect("written")).unwrap();
    // The graph before the breaking pass, relus included.
    assert!(text.ends_with(&kiln_ir::print(&graph())), "{text}");

    // Without verify_each the broken graph gets through.
    let mut inst = Instrumentation { reproducer: Reproducer::Off, ..Default::default() };
    pm.run(&mut graph(), &PassContext::default(), &mut inst).unwrap();
}

#[test]
fn an_invalid_input_graph_is_rejected_before_any_pass() {
    let mut g = graph();
    let relu = g.node_ids().find(|&id| !g.users(id).is_empty() && matches!(g.node(id).op, Op::Unary(_))).unwrap();
    g.remove_node(relu);
    let pm = PassManager::parse("dce").unwrap();
    let err = pm.run(&mut g, &PassContext::default(), &mut Instrumentation::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
}

#[test]
fn a_fixpoint_that_hits_its_cap_is_an_error_naming_the_group() {
    // dce changes the graph in the first iteration, so one iteration cannot show a fixed point.
    let (r, _) = run_with("cse,fixpoint{max-iterations=1}(canonicalize,dce)", |_| {});
    let err = r.unwrap_err();
    assert_eq!(
        err.to_string(),
        "fixpoint group `fixpoint{max-iterations=1}(canonicalize,dce)` did not converge within 1 iterations"
    );
}

#[test]
fn passes_report_no_change_on_their_own_output() {
    // Required for fixpoint groups to terminate: a second run of each pass changes nothing.
    for info in kiln_passes::passes() {
        let pass = info.create(&[]).unwrap();
        let mut g = graph();
        pass.run(&mut g, &PassContext::default()).unwrap();
        let printed = kiln_ir::print(&g);
        assert!(!pass.run(&mut g, &PassContext::default()).unwrap(), "{} changed its own output", info.name);
        assert_eq!(kiln_ir::print(&g), printed);
    }
}

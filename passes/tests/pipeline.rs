//! Pipeline text: exact round trips, whitespace tolerance, named pipelines, and parse errors with a column and a
//! caret (snapshots in `snapshots/`; bless with `INSTA_UPDATE=always cargo test -p kiln-passes --test pipeline`).

use kiln_passes::{Pipeline, PipelineItem};

#[test]
fn canonical_text_round_trips_exactly() {
    for text in [
        "",
        "cse",
        "canonicalize,cse,fixpoint(fold-constants,dce)",
        "fold-constants{max-elements=32}",
        "O2",
        "canonicalize,O1",
        "fixpoint{max-iterations=4}(cse,fixpoint(dce))",
        "infer-shapes{bind=batch:8,bind=seq:4}",
        "cpu-default,cuda-default",
        "fixpoint()",
        "O0,O3",
    ] {
        let p = Pipeline::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(p.to_string(), text);
        assert_eq!(Pipeline::parse(&p.to_string()).unwrap(), p);
    }
}

#[test]
fn whitespace_is_allowed_between_tokens_and_printing_drops_it() {
    let p = Pipeline::parse(
        "  canonicalize , fixpoint { max-iterations = 3 } ( cse , dce ) ,fold-constants{ max-elements=8 }  ",
    )
    .unwrap();
    assert_eq!(p.to_string(), "canonicalize,fixpoint{max-iterations=3}(cse,dce),fold-constants{max-elements=8}");
}

#[test]
fn named_pipelines_stay_names_until_expanded() {
    let p = Pipeline::parse("canonicalize,O1").unwrap();
    assert_eq!(p.items[1], PipelineItem::Named("O1".into()));
    assert_eq!(
        p.expand().to_string(),
        "canonicalize,infer-shapes,simplify-shape-arith,canonicalize,fold-constants,cse,dce"
    );
    assert_eq!(
        Pipeline::parse("O3").unwrap().expand().to_string(),
        Pipeline::parse("O2").unwrap().expand().to_string()
    );
}

#[test]
fn every_named_pipeline_parses_and_expands_to_passes_only() {
    fn only_passes(p: &Pipeline) -> bool {
        p.items.iter().all(|i| match i {
            PipelineItem::Pass { .. } => true,
            PipelineItem::Named(_) => false,
            PipelineItem::Fixpoint { body, .. } => only_passes(body),
        })
    }
    for named in kiln_passes::pipelines() {
        let p = Pipeline::parse(named.text).unwrap_or_else(|e| panic!("{}: {e}", named.name));
        assert!(only_passes(&p.expand()), "{} does not expand fully", named.name);
        assert_eq!(p.to_string(), named.text, "{}: registered text is not canonical", named.name);
    }
}

#[test]
fn parse_errors_give_a_column_and_a_caret() {
    for (name, text) in [
        ("unknown_pass", "canonicalize,frobnicate,dce"),
        ("unknown_option", "fold-constants{max-elements=8,fast=true}"),
        ("option_for_pass_without_options", "cse{aggressive=1}"),
        ("bad_option_value", "fold-constants{max-elements=lots}"),
        ("option_given_twice", "fold-constants{max-elements=8,max-elements=9}"),
        ("bad_bind", "infer-shapes{bind=batch}"),
        ("missing_equals", "fold-constants{max-elements}"),
        ("missing_value", "fold-constants{max-elements=}"),
        ("unclosed_options", "fold-constants{max-elements=8"),
        ("trailing_comma", "cse,dce,"),
        ("double_comma", "cse,,dce"),
        ("unclosed_fixpoint", "cse,fixpoint(canonicalize,dce"),
        ("unmatched_paren", "cse),dce"),
        ("fixpoint_without_parens", "fixpoint,cse"),
        ("fixpoint_zero_iterations", "fixpoint{max-iterations=0}(cse)"),
        ("fixpoint_unknown_option", "fixpoint{iterations=3}(cse)"),
        ("options_on_named_pipeline", "O2{level=3}"),
        ("stray_character", "cse;dce"),
    ] {
        let err = Pipeline::parse(text).expect_err(name);
        insta::assert_snapshot!(format!("error_{name}"), err.to_string());
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let text = format!("{}cse{}", "fixpoint(".repeat(10_000), ")".repeat(10_000));
    let err = Pipeline::parse(&text).unwrap_err();
    assert!(err.message.contains("nest deeper"), "{}", err.message);
}

#[test]
fn hostile_text_never_panics() {
    let base = "canonicalize,fixpoint{max-iterations=3}(cse,fold-constants{max-elements=8}),O1";
    for cut in 0..=base.len() {
        let _ = Pipeline::parse(&base[..cut]);
        for c in ['{', '}', '(', ')', ',', '=', ' ', 'é', '\t'] {
            let mut s = base[..cut].to_string();
            s.push(c);
            s.push_str(&base[cut..]);
            let _ = Pipeline::parse(&s);
        }
    }
}

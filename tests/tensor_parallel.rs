//! The tensor-parallel example (`examples/tensor_parallel.rs`): an MLP split by columns then rows across ranks,
//! partial products all-reduced, equals the unsplit model.

#[path = "../examples/tensor_parallel.rs"]
mod example;

#[test]
fn split_mlp_equals_the_unsplit_model() {
    for ranks in [2, 4] {
        let worst = example::run(ranks).unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
        assert!(worst <= 1e-5, "{ranks} ranks: max difference {worst:e}");
    }
}

#[test]
fn a_width_that_does_not_split_is_an_error() {
    let err = example::run(3).unwrap_err().to_string();
    assert!(err.contains("does not split into 3"), "{err}");
}

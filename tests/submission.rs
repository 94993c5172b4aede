//! Serving independent requests concurrently through the JIT API: requests submitted on forked executors give
//! exactly the outputs of sequential runs, and a failing request fails alone.

use std::collections::BTreeMap;

use kiln::{CompileOptions, Error, Model};
use kiln_ir::Tensor;

/// `y = tanh(x @ w) + x[:, :4]`, with a constant `w`.
fn model() -> Model {
    let text = r#"graph "served" {
  %0 = input {name="x"} : f32[3,6]
  %1 = constant {value=f32[6,4] [0.5, -1.0, 0.25, 2.0, 1.5, 0.0, -0.5, 1.0, -2.0, 0.75, 1.0, 0.5, 0.1, 0.2, 0.3, 0.4, -0.1, -0.2, -0.3, -0.4, 1.0, 1.0, 1.0, 1.0]} : f32[6,4]
  %2 = matmul %0, %1 : f32[3,4]
  %3 = tanh %2 : f32[3,4]
  %4 = slice %0 {starts=[0,0], ends=[3,4], axes=[0,1], steps=[1,1]} : f32[3,4]
  %5 = add %3, %4 : f32[3,4]
  output "y" = %5
}
"#;
    Model::from_graph(kiln_ir::parse(text).expect("parses")).expect("verifies")
}

fn input(seed: usize) -> BTreeMap<String, Tensor> {
    let values: Vec<f32> = (0..18).map(|i| ((i * 7 + seed * 13) % 17) as f32 * 0.25 - 2.0).collect();
    BTreeMap::from([("x".to_string(), Tensor::from_vec(vec![3, 6], values).unwrap())])
}

#[test]
fn concurrent_requests_equal_sequential_runs() {
    let compiled = model().compile(&CompileOptions { threads: 2, ..CompileOptions::default() }).unwrap();
    let lanes = compiled.executors(3).unwrap();
    let requests: Vec<_> =
        (0..24).map(|i| compiled.submit(&lanes[i % lanes.len()], input(i)).expect("submits")).collect();
    for (i, request) in requests.into_iter().enumerate() {
        let got = request.wait().unwrap_or_else(|e| panic!("request {i}: {e}"));
        let want = compiled.run(&input(i)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "y");
        assert_eq!(got[0].1.as_bytes(), want[0].1.as_bytes(), "request {i}: concurrent result differs");
    }
}

#[test]
fn a_bad_request_fails_alone() {
    let compiled = model().compile(&CompileOptions::default()).unwrap();
    let lane = &compiled.executors(1).unwrap()[0];
    let wrong = BTreeMap::from([("x".to_string(), Tensor::from_vec(vec![2, 6], vec![0f32; 12]).unwrap())]);
    let bad = compiled.submit(lane, wrong).unwrap();
    let good = compiled.submit(lane, input(1)).unwrap();
    match bad.wait() {
        Err(Error::Input(message)) => assert!(message.contains('x'), "{message}"),
        other => panic!("expected an input error, got {other:?}"),
    }
    assert_eq!(good.wait().unwrap()[0].1.as_bytes(), compiled.run(&input(1)).unwrap()[0].1.as_bytes());
}

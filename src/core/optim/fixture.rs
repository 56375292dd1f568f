//! Test-only access to `fixtures/optim/optim.json` (independent reference values for
//! the optimizers, the bigram loss and gradient, and the count model; see its README)
//! and the ulp measure the comparisons use. It lives with the optimizer, the lowest
//! area whose tests read it, so that `train`'s tests reach it along the allowed
//! `train -> optim` edge.

use serde_json::Value;

/// The parsed fixture file.
pub fn load() -> Value {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/optim/optim.json");
    let text = std::fs::read_to_string(&path).expect("fixtures/optim/optim.json");
    serde_json::from_str(&text).expect("valid JSON")
}

/// A list of f32 bit strings.
pub fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| f32::from_bits(u32::from_str_radix(s.as_str().expect("hex"), 16).expect("hex")))
        .collect()
}

/// One f32 bit string.
pub fn f32_of(v: &Value) -> f32 {
    f32::from_bits(u32::from_str_radix(v.as_str().expect("hex"), 16).expect("hex"))
}

/// A list of integers.
pub fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("an array")
        .iter()
        .flat_map(|x| match x.as_array() {
            Some(row) => row.iter().map(|y| y.as_i64().expect("int")).collect(),
            None => vec![x.as_i64().expect("int")],
        })
        .collect()
}

/// The spacing of f32 values at magnitude `x` (the ulp of |x|; of the smallest normal
/// for 0 and subnormals).
pub fn ulp(x: f32) -> f64 {
    let x = x.abs().max(f32::MIN_POSITIVE);
    let next = f32::from_bits(x.to_bits() + 1);
    (next as f64) - (x as f64)
}

/// |a - b| in ulps of the largest of `scale` (the magnitudes of the operation's
/// operands and result): the honest measure where a subtraction cancels.
pub fn ulps_at(a: f32, b: f32, scale: &[f32]) -> f64 {
    let s = scale.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    ((a as f64) - (b as f64)).abs() / ulp(s)
}

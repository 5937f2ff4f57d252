//! Inputs found by `cargo fuzz` (fuzz/), kept as regression tests.

use cqlm::Config;

/// fuzz target `config`: a `rope_theta` written with 29 significant digits parsed to
/// a value one ulp off the correctly rounded one, so a config did not survive
/// `from_json(to_json(c))`, and two readers of one archive could disagree on θ.
/// serde_json now parses floats with correct rounding (`float_roundtrip`).
#[test]
fn config_rope_theta_parses_correctly_rounded_and_round_trips() {
    let text = include_str!("../fuzz_inputs/config-rope-theta-roundtrip.json");
    let c = Config::from_json(text).expect("a valid config");
    let want: f64 = "11110000000000000000535854321.0".parse().unwrap();
    assert_eq!(c.rope_theta.to_bits(), want.to_bits());
    assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
}

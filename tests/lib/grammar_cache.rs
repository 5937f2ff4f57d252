//! The token space's cache of compiled grammars: a constraint taken from it
//! shares a lexer that earlier requests warmed (and, every 64 requests, a fresh
//! copy), yet gives token by token the forced runs and masks of a constraint
//! compiled in a fresh token space, along many different paths through a
//! schema and a tool set.

use cqlm::constrain::{ConstraintSpec, TokenMask, TokenSpace, ToolChoice, ToolSet};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::Arc;

fn walk(space: &TokenSpace, fresh: &TokenSpace, spec: &ConstraintSpec, seed: u64, vocab: usize) {
    let mut a = space.compile(spec).unwrap();
    let mut b = fresh.compile(spec).unwrap();
    let (mut ma, mut mb) = (TokenMask::none(vocab), TokenMask::none(vocab));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for step in 0..40 {
        assert_eq!(a.take_forced(), b.take_forced(), "seed {seed} step {step}");
        if a.is_stopped() || b.is_stopped() {
            assert_eq!(a.is_stopped(), b.is_stopped());
            return;
        }
        a.mask_into(&mut ma).unwrap();
        b.mask_into(&mut mb).unwrap();
        assert_eq!(ma.words(), mb.words(), "seed {seed} step {step}");
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&t| mb.is_allowed(t) && t != b.eos())
            .collect();
        if allowed.is_empty() {
            return;
        }
        let t = allowed[rng.random_range(0..allowed.len())];
        a.commit(t).unwrap();
        b.commit(t).unwrap();
    }
}

#[test]
fn cached_grammars_give_the_masks_of_a_fresh_compile() {
    let model = Arc::new(cqlm::model::builtin::model().unwrap());
    let vocab = model.config.vocab;
    let space = TokenSpace::for_model(&model).unwrap();
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["city", "n"], "additionalProperties": false});
    let tools: Value = serde_json::from_str(include_str!("../../tools/train/tools.json")).unwrap();
    let tools = ToolSet::from_openai(&tools).unwrap();
    let specs = [
        ConstraintSpec::json_schema(schema),
        ConstraintSpec::Tools {
            tools: tools.clone(),
            choice: ToolChoice::Auto,
            parallel: false,
        },
        ConstraintSpec::Tools {
            tools,
            choice: ToolChoice::Required,
            parallel: true,
        },
    ];
    for (k, spec) in specs.iter().enumerate() {
        // Past the 64 requests one warm lexer serves.
        for seed in 0..70 {
            let fresh = TokenSpace::for_model(&model).unwrap();
            walk(&space, &fresh, spec, seed + 100 * k as u64, vocab);
        }
    }
}

//! Token logprobs ([`TokenLogprob`]) in each API's shape: the entries of
//! chat completions' `logprobs.content` and of the Responses API's
//! `output_text.logprobs` (`token`, `logprob`, `bytes`, `top_logprobs`, plus
//! cqlm's `id`, as llama-server adds it), and the legacy completions' table
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

use crate::session::logprobs::TokenLogprob;
use crate::session::tokenizer::TextTokenizer;
use serde_json::{json, Map, Value};

/// A token's bytes and its text (the bytes read as UTF-8, a partial
/// character replaced by U+FFFD).
fn piece(tok: &TextTokenizer, id: u32) -> (Vec<u8>, String) {
    let bytes = tok.piece(id).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (bytes, text)
}

/// One token with its logprob: `{"id", "token", "logprob", "bytes"}`.
fn entry(tok: &TextTokenizer, id: u32, logprob: f32) -> Value {
    let (bytes, text) = piece(tok, id);
    json!({"id": id, "token": text, "logprob": logprob, "bytes": bytes})
}

/// The chat completions / Responses entries of `lps`, one per token, each
/// with its `top_logprobs`.
pub(super) fn entries(tok: &TextTokenizer, lps: &[TokenLogprob]) -> Vec<Value> {
    lps.iter()
        .map(|lp| {
            let mut e = entry(tok, lp.id, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(id, l)| entry(tok, id, l)).collect();
            e
        })
        .collect()
}

/// Chat completions' `logprobs` object of `lps`.
pub(super) fn chat(tok: &TextTokenizer, lps: &[TokenLogprob]) -> Value {
    json!({"content": entries(tok, lps), "refusal": null})
}

/// The legacy completions' `logprobs` table of `lps`, whose text starts at
/// character `*at` (the prompt's length for the first tokens, as OpenAI counts
/// `text_offset`); `*at` moves past their text.
pub(super) fn completion(tok: &TextTokenizer, lps: &[TokenLogprob], at: &mut usize) -> Value {
    let (mut tokens, mut logprobs, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for lp in lps {
        let text = piece(tok, lp.id).1;
        offsets.push(*at);
        *at += text.chars().count();
        tokens.push(text);
        logprobs.push(lp.logprob);
        let top: Map<String, Value> = lp
            .top
            .iter()
            .map(|&(id, l)| (piece(tok, id).1, json!(l)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}

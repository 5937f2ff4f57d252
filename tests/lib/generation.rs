//! `Generation`, the one generation state machine of `cqlm generate`, the
//! library's `Session` and the server, driven by `Session::run` over a
//! scripted engine (fixed logits per position, written here): every finish
//! reason, stop strings across tokens, a constraint's forced tokens and masks,
//! top-p draws that need the full logits, a callback that stops, and a model's
//! whole-text decode against the streamed deltas.

use cqlm::constrain::{ConstraintSpec, TokenMask, TokenSpace};
use cqlm::engine::{host_readout, host_readout_masked};
use cqlm::session::sample::{Sampler, SamplerConfig};
use cqlm::session::tokenizer::{TextStream, TextTokenizer};
use cqlm::session::{Emitted, Finish, Generation, Session};
use cqlm::{Config, Engine, Model, Readout, StepOut};
use std::sync::{Arc, Mutex};

/// The logits after `pos` tokens: a peak of `height` at the script's token.
type Script = Box<dyn Fn(u64) -> u32 + Send>;

/// An engine whose next-token logits depend only on the position: every id
/// at 0 but the script's, at `height`.
struct Scripted {
    config: Config,
    script: Script,
    height: f32,
    pos: u64,
    logits: Vec<f32>,
    valid: bool,
    candidates: Vec<(f32, u32)>,
    masked: Vec<f32>,
    /// Readouts asked for, in order (what the generation needed).
    asked: Arc<Mutex<Vec<Readout>>>,
}

impl Scripted {
    fn new(config: &Config, height: f32, script: Script) -> Scripted {
        Scripted {
            config: config.clone(),
            script,
            height,
            pos: 0,
            logits: vec![0.0; config.vocab],
            valid: false,
            candidates: Vec::new(),
            masked: Vec::new(),
            asked: Arc::default(),
        }
    }
}

impl Engine for Scripted {
    fn config(&self) -> &Config {
        &self.config
    }
    fn step(&mut self, token: u32, readout: Readout) -> cqlm::Result<StepOut<'_>> {
        self.step_many(&[token], readout)
    }
    fn step_many(&mut self, ids: &[u32], readout: Readout) -> cqlm::Result<StepOut<'_>> {
        assert!(ids.iter().all(|&t| (t as usize) < self.config.vocab));
        self.asked.lock().unwrap().push(readout);
        self.pos += ids.len() as u64;
        self.logits.iter_mut().for_each(|v| *v = 0.0);
        self.logits[(self.script)(self.pos) as usize] = self.height;
        self.valid = readout.needs_logits();
        host_readout(&self.logits, readout, &mut self.candidates)
    }
    fn reset(&mut self) {
        self.pos = 0;
        self.valid = false;
    }
    fn position(&self) -> u64 {
        self.pos
    }
    fn describe(&self) -> String {
        "scripted".into()
    }
    fn last_logits(&mut self) -> cqlm::Result<Option<&[f32]>> {
        Ok(self.valid.then_some(&self.logits[..]))
    }
    fn readout(&mut self, r: Readout, mask: Option<&TokenMask>) -> cqlm::Result<StepOut<'_>> {
        self.asked.lock().unwrap().push(r);
        host_readout_masked(
            &self.logits,
            r,
            mask,
            &mut self.masked,
            &mut self.candidates,
        )
    }
}

fn builtin() -> Arc<Model> {
    Arc::new(cqlm::model::builtin::model().unwrap())
}

/// A session over a scripted engine that, after the `prompt`, chooses
/// `tokens` in order (then `after` forever).
fn session(model: &Arc<Model>, prompt: &[u32], tokens: Vec<u32>, after: u32) -> Session {
    let start = prompt.len() as u64;
    let script: Script =
        Box::new(move |pos| tokens.get((pos - start) as usize).copied().unwrap_or(after));
    let engine = Scripted::new(&model.config, 40.0, script);
    let mut s = Session::from_engine(Box::new(engine), Arc::clone(model));
    s.prefill(prompt).unwrap();
    s
}

/// Run `g` on `s`, collecting the emitted ids and text deltas.
fn run(s: &mut Session, g: &mut Generation<'_>) -> (Finish, Vec<u32>, String) {
    let (mut ids, mut text) = (Vec::new(), String::new());
    let finish = s
        .run(g, |e: Emitted<'_>| {
            ids.extend_from_slice(e.ids);
            text.push_str(e.text);
            true
        })
        .unwrap();
    (finish, ids, text)
}

#[test]
fn greedy_generation_ends_at_the_limit_or_at_eos_and_the_session_holds_every_token() {
    let model = builtin();
    let eos = model.config.eos;
    let prompt = [model.config.bos, 40, 41];
    // The limit: 5 tokens of the script, all stepped.
    let mut s = session(&model, &prompt, vec![7, 8, 9, 10, 11, 12], 13);
    let mut g = Generation::new(Vec::new(), Sampler::greedy(), eos, 5).with_history(&prompt);
    let (finish, ids, _) = run(&mut s, &mut g);
    assert_eq!(finish, Finish::Length);
    assert_eq!(ids, [7, 8, 9, 10, 11]);
    assert_eq!(s.tokens(), [&prompt[..], &ids].concat());
    assert_eq!(s.engine().position(), 8);
    // EOS third: two tokens, EOS not emitted.
    let mut s = session(&model, &prompt, vec![7, 8, eos, 9], 13);
    let mut g = Generation::new(Vec::new(), Sampler::greedy(), eos, 10);
    let (finish, ids, _) = run(&mut s, &mut g);
    assert_eq!((finish, ids), (Finish::Eos, vec![7, 8]));
    assert_eq!(g.output().unwrap().finish_reason(), "stop");
    // A generation with its own prompt (the server's): fed first, then chosen.
    let engine = Scripted::new(
        &model.config,
        40.0,
        Box::new(|pos| if pos == 4 { 21 } else { 22 }),
    );
    let mut s = Session::from_engine(Box::new(engine), Arc::clone(&model));
    let mut g = Generation::new(vec![1, 2, 3, 4], Sampler::greedy(), eos, 3);
    let (finish, ids, _) = run(&mut s, &mut g);
    assert_eq!((finish, ids), (Finish::Length, vec![21, 22, 22]));
    assert_eq!(s.tokens(), [1, 2, 3, 4, 21, 22, 22]);
    // Without a prompt, a session that was never prefilled has nothing to choose from.
    let engine = Scripted::new(&model.config, 40.0, Box::new(|_| 5));
    let mut s = Session::from_engine(Box::new(engine), Arc::clone(&model));
    let mut g = Generation::new(Vec::new(), Sampler::greedy(), eos, 3);
    assert!(s.run(&mut g, |_| true).is_err());
}

#[test]
fn each_sampler_reads_out_only_what_it_needs() {
    let model = builtin();
    let eos = model.config.eos;
    let prompt = [model.config.bos];
    let cases = [
        (SamplerConfig::default(), Readout::Argmax),
        (
            SamplerConfig {
                temperature: 0.8,
                top_k: 40,
                seed: 1,
                ..Default::default()
            },
            Readout::TopK(40),
        ),
        (
            SamplerConfig {
                temperature: 0.8,
                top_p: 0.9,
                seed: 1,
                ..Default::default()
            },
            Readout::Nucleus { temperature: 0.8 },
        ),
        (
            SamplerConfig {
                temperature: 0.8,
                repeat_penalty: 1.3,
                seed: 1,
                ..Default::default()
            },
            Readout::Logits,
        ),
    ];
    for (cfg, want) in cases {
        let engine = Scripted::new(&model.config, 60.0, Box::new(|pos| 100 + pos as u32));
        let asked = Arc::clone(&engine.asked);
        let mut s = Session::from_engine(Box::new(engine), Arc::clone(&model));
        s.prefill(&prompt).unwrap();
        asked.lock().unwrap().clear();
        let mut g = Generation::new(Vec::new(), Sampler::new(cfg.clone()).unwrap(), eos, 4);
        let (finish, ids, _) = run(&mut s, &mut g);
        // A peak 60 above the rest: every sampler takes the script's token.
        assert_eq!(
            (finish, ids),
            (Finish::Length, vec![101, 102, 103, 104]),
            "{cfg:?}"
        );
        assert_eq!(g.next(1).unwrap(), None);
        // Four choices read out what the sampler needs; the last token is
        // appended without one.
        let asked = asked.lock().unwrap().clone();
        assert_eq!(
            asked,
            [want, want, want, want, Readout::Deferred],
            "{cfg:?}"
        );
    }
}

#[test]
fn a_top_p_draw_the_candidates_cannot_decide_reads_the_logits() {
    // Flat logits: 256 candidates hold 256/vocab of the mass, never top-p 0.99.
    let model = builtin();
    let eos = model.config.eos;
    let engine = Scripted::new(&model.config, 0.0, Box::new(|_| 0));
    let mut s = Session::from_engine(Box::new(engine), Arc::clone(&model));
    s.prefill(&[model.config.bos]).unwrap();
    let cfg = SamplerConfig {
        temperature: 1.0,
        top_p: 0.99,
        seed: 9,
        ..Default::default()
    };
    let mut g = Generation::new(Vec::new(), Sampler::new(cfg.clone()).unwrap(), eos, 6);
    let (finish, ids, _) = run(&mut s, &mut g);
    assert_eq!((finish, ids.len()), (Finish::Length, 6));
    assert_eq!(g.nucleus_misses(), 6);
    assert_eq!(s.nucleus_misses(), 6);
    // The same draws as a sampler over the full logits alone.
    let mut alone = Sampler::new(cfg).unwrap();
    let flat = vec![0.0f32; model.config.vocab];
    let want: Vec<u32> = (0..6).map(|_| alone.sample(&flat, &[])).collect();
    assert_eq!(ids, want);
}

#[test]
fn a_stop_string_across_tokens_ends_the_text_before_it_and_is_never_streamed() {
    let model = builtin();
    let tok = TextTokenizer::for_model(&model).unwrap();
    let words = tok.encode("Hello world, and the rest").unwrap()[1..].to_vec();
    assert!(words.len() >= 4);
    let prompt = [model.config.bos];
    for (stop, want) in [
        ("lo wor", "Hel"),
        ("d, an", "Hello worl"),
        ("zzz", "Hello world, and the rest"),
    ] {
        let mut s = session(&model, &prompt, words.clone(), model.config.eos);
        let mut g = Generation::new(Vec::new(), Sampler::greedy(), model.config.eos, 40)
            .with_text(TextStream::new(&tok, vec![stop.to_string()]));
        let (finish, ids, streamed) = run(&mut s, &mut g);
        let out = g.output().unwrap();
        assert_eq!(out.text, want, "{stop}");
        let rest = g.text().unwrap().rest().unwrap();
        assert_eq!(format!("{streamed}{rest}"), want, "{stop}");
        if stop == "zzz" {
            assert_eq!(finish, Finish::Eos);
            assert_eq!(ids, words);
        } else {
            assert_eq!(finish, Finish::StopString, "{stop}");
            assert_eq!(out.finish_reason(), "stop");
        }
    }
}

#[test]
fn a_constraint_forces_its_tokens_masks_the_choices_and_completes() {
    let model = builtin();
    let tok = TextTokenizer::for_model(&model).unwrap();
    let space = TokenSpace::for_model(&model).unwrap();
    let prompt = [model.config.bos];
    // The script wants letters; the pattern allows `id-` then three digits.
    let letters = tok.encode("zzzzzzzzzz").unwrap()[1..].to_vec();
    for cfg in [
        SamplerConfig::default(),
        SamplerConfig {
            temperature: 1.0,
            top_k: 5,
            seed: 2,
            ..Default::default()
        },
        SamplerConfig {
            temperature: 1.0,
            top_p: 0.5,
            seed: 2,
            ..Default::default()
        },
        SamplerConfig {
            temperature: 1.0,
            seed: 2,
            ..Default::default()
        },
    ] {
        let c = space
            .compile(&ConstraintSpec::Regex("id-[0-9]{3}".into()))
            .unwrap();
        let mut s = session(&model, &prompt, letters.clone(), letters[0]);
        let mut g = Generation::new(
            Vec::new(),
            Sampler::new(cfg.clone()).unwrap(),
            model.config.eos,
            20,
        )
        .with_text(TextStream::new(&tok, vec![]))
        .with_constraint(c, model.config.vocab);
        let (finish, ids, text) = run(&mut s, &mut g);
        assert_eq!(finish, Finish::Complete, "{cfg:?}");
        let out = g.output().unwrap();
        assert_eq!(out.text, text);
        assert!(
            text.starts_with("id-") && text.len() == 6,
            "{cfg:?}: {text:?}"
        );
        assert!(text[3..].bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        let stats = g.constraint_stats();
        assert!(stats.forced >= 1, "{stats:?}");
        // Every token was forced or chosen (and EOS perhaps chosen at the end).
        let counted = stats.forced + stats.chosen;
        assert!(
            (ids.len()..=ids.len() + 1).contains(&counted),
            "{stats:?} {ids:?}"
        );
        assert_eq!(stats.masks, stats.chosen, "{stats:?}");
        assert!(out.tool_calls.is_empty());
        // The session holds every emitted token.
        assert_eq!(s.tokens(), [&prompt[..], &ids].concat());
    }
    // The limit cuts the forced start: incomplete, `length`.
    let c = space
        .compile(&ConstraintSpec::Regex("abcdefgh[0-9]".into()))
        .unwrap();
    let mut s = session(&model, &prompt, letters.clone(), letters[0]);
    let mut g = Generation::new(Vec::new(), Sampler::greedy(), model.config.eos, 2)
        .with_text(TextStream::new(&tok, vec![]))
        .with_constraint(c, model.config.vocab);
    let (finish, ids, _) = run(&mut s, &mut g);
    assert_eq!((finish, ids.len()), (Finish::Length, 2));
    assert_eq!(g.output().unwrap().finish_reason(), "length");
}

#[test]
fn a_callback_that_says_stop_cancels_after_that_token() {
    let model = builtin();
    let prompt = [model.config.bos];
    let mut s = session(&model, &prompt, vec![5, 6, 7, 8, 9], 10);
    let mut g = Generation::new(Vec::new(), Sampler::greedy(), model.config.eos, 10);
    let mut seen = Vec::new();
    let finish = s
        .run(&mut g, |e| {
            seen.extend_from_slice(e.ids);
            seen.len() < 2
        })
        .unwrap();
    assert_eq!((finish, seen), (Finish::Cancelled, vec![5, 6]));
    assert_eq!(g.output().unwrap().finish_reason(), "length");
    // Both tokens are in the session, which can go on.
    assert_eq!(s.tokens(), [model.config.bos, 5, 6]);
    let mut g = Generation::new(Vec::new(), Sampler::greedy(), model.config.eos, 2);
    let (_, ids, _) = run(&mut s, &mut g);
    assert_eq!(ids, [7, 8]);
}

#[test]
fn streamed_text_equals_one_whole_decode() {
    // Multi-byte characters, combining marks and emoji, cut into single-byte
    // tokens where the vocabulary has no merge: each push hands out whole
    // characters only, and the pieces add up to the whole decode.
    let model = builtin();
    let tok = TextTokenizer::for_model(&model).unwrap();
    let text = "Caf\u{e9} cafe\u{301} na\u{ef}ve \u{1F600}\u{1F44D}\u{1F3FD} \u{4e2d}\u{6587} \u{3b1}\u{3b2} end";
    let ids = tok.encode(text).unwrap()[1..].to_vec();
    let whole = tok.decode(&ids).unwrap();
    let mut stream = TextStream::new(&tok, vec![]);
    let mut streamed = String::new();
    let mut pieces = 0;
    for &id in &ids {
        if let Some(d) = stream.push(id).unwrap() {
            assert!(!d.contains('\u{FFFD}'), "a partial character: {d:?}");
            streamed.push_str(&d);
            pieces += 1;
        }
    }
    assert_eq!(streamed, whole);
    assert_eq!(stream.full().unwrap(), whole);
    assert!(pieces < ids.len(), "some characters took several tokens");
    // A stream cut inside a character: the whole decode's replacement at the end.
    let cut = &ids[..ids.len() - 8];
    let mut stream = TextStream::new(&tok, vec![]);
    for &id in cut {
        stream.push(id).unwrap();
    }
    assert_eq!(stream.full().unwrap(), tok.decode(cut).unwrap());
}

#[test]
fn a_byte_fallback_tokenizer_streams_whole_characters() {
    // A SentencePiece-style vocabulary: `<0xNN>` byte tokens and a Metaspace
    // (▁) decoder, which the whole decode strips at the start.
    let json = r#"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                        "rstrip": false, "normalized": false, "special": true}],
      "normalizer": null,
      "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": false},
      "post_processor": null,
      "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": true, "ignore_merges": false,
        "vocab": {"<s>": 0, "<0xC3>": 1, "<0xA9>": 2, "<0xF0>": 3, "<0x9F>": 4, "<0x98>": 5,
                  "<0x80>": 6, "\u2581caf": 7, "\u2581ok": 8, "\u2581": 9},
        "merges": []}
    }"#;
    let tok = TextTokenizer::from_json(json, 0).unwrap();
    // "café 😀 ok": ▁caf <C3><A9> ▁ <F0><9F><98><80> ▁ok
    let ids = [7, 1, 2, 9, 3, 4, 5, 6, 8];
    let whole = tok.decode(&ids).unwrap();
    assert_eq!(whole, "caf\u{e9} \u{1F600} ok");
    let mut stream = TextStream::new(&tok, vec![]);
    let mut streamed = String::new();
    for &id in &ids {
        if let Some(d) = stream.push(id).unwrap() {
            assert!(!d.contains('\u{FFFD}'), "{d:?}");
            streamed.push_str(&d);
        }
    }
    assert_eq!(streamed, whole);
}

#[test]
fn logprobs_keep_every_draw_and_read_the_denominator_at_temperature_one() {
    let model = builtin();
    let eos = model.config.eos;
    let prompt: Vec<u32> = vec![model.config.bos, 312, 97, 1040, 33];
    let sampler = |temperature: f32, top_k: usize, top_p: f32| SamplerConfig {
        temperature,
        top_k,
        top_p,
        seed: 11,
        ..Default::default()
    };
    // (sampler, the readout its choices take with logprobs)
    let cases = [
        (
            SamplerConfig::default(),
            Readout::Nucleus { temperature: 1.0 },
        ),
        (sampler(1.0, 40, 1.0), Readout::Nucleus { temperature: 1.0 }),
        (sampler(1.0, 0, 0.9), Readout::Nucleus { temperature: 1.0 }),
        (sampler(0.7, 0, 0.9), Readout::Logits),
        (sampler(1.0, 0, 1.0), Readout::Logits),
    ];
    for (cfg, want) in cases {
        // The real model: the same tokens with and without logprobs, one
        // logprob (≤ 0) per token, the chosen token among a greedy's top.
        let mut tokens = Vec::new();
        for logprobs in [false, true] {
            let engine = cqlm::CpuEngine::new(Arc::clone(&model)).unwrap();
            let mut s = Session::from_engine(Box::new(engine), Arc::clone(&model));
            let mut g =
                Generation::new(prompt.clone(), Sampler::new(cfg.clone()).unwrap(), eos, 12);
            if logprobs {
                g = g.with_logprobs(3);
            }
            let mut ids = Vec::new();
            s.run(&mut g, |e: Emitted<'_>| {
                ids.extend_from_slice(e.ids);
                true
            })
            .unwrap();
            let lps = g.take_logprobs();
            if logprobs {
                assert_eq!(lps.len(), ids.len(), "{cfg:?}");
                for (lp, &id) in lps.iter().zip(&ids) {
                    assert_eq!(lp.id, id);
                    assert!(lp.logprob <= 0.0 && lp.top.len() == 3, "{lp:?}");
                    if cfg.temperature == 0.0 {
                        assert_eq!(lp.top[0].0, id, "{lp:?}");
                    }
                }
            } else {
                assert!(g.take_logprobs().is_empty());
            }
            tokens.push(ids);
        }
        assert_eq!(tokens[0], tokens[1], "{cfg:?}");
        // The readouts asked for, on a scripted engine.
        let engine = Scripted::new(&model.config, 60.0, Box::new(|pos| 100 + pos as u32));
        let asked = Arc::clone(&engine.asked);
        let mut s = Session::from_engine(Box::new(engine), Arc::clone(&model));
        s.prefill(&[model.config.bos]).unwrap();
        asked.lock().unwrap().clear();
        let mut g = Generation::new(Vec::new(), Sampler::new(cfg.clone()).unwrap(), eos, 2)
            .with_logprobs(0);
        run(&mut s, &mut g);
        assert_eq!(asked.lock().unwrap()[..2], [want, want], "{cfg:?}");
    }
}

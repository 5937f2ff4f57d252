//! [`TokenSpace`]: a model's tokens as llguidance sees them (a byte trie from the
//! archive's `tokenizer.json`), and the parser factory that compiles constraints
//! against it. Built once per model and shared.

use super::spec::{Constraint, ConstraintSpec};
use super::tools::{CallGrammars, Grammars, ToolMarkers};
use crate::error::{Error, Result};
use crate::model::weights::Model;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// The trie and the Hugging Face tokenizer that tokenizes forced text canonically.
struct Env {
    trie: TokTrie,
    hf: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.hf
                .encode(s, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// Compiled grammars kept for reuse (a server sees the same tool set or schema
/// again and again); past this many, the cache starts over.
const CACHED_GRAMMARS: usize = 64;

/// Requests that share one warm lexer before it is replaced by a fresh copy
/// (bounding what one shared lexer accumulates: its state count, and any error
/// state a request could leave in it).
const WARM_USES: usize = 64;

/// A compiled grammar: as compiled (`cold`, never run) and the copy requests
/// share their lexer with (`warm`). llguidance builds its lexer's DFA lazily, by
/// derivatives; the states a request builds (the first token of a free string
/// walks most of the vocabulary through new ones) stay in the shared lexer, so
/// the next request with the grammar finds them built. Matchers cloned from
/// `warm` share its lexer behind a mutex and nothing else: parser state is each
/// request's own, and the masks are the same as from a fresh lexer.
struct Cached {
    cold: Matcher,
    warm: Matcher,
    uses: usize,
}

impl Cached {
    fn new(m: Matcher) -> Cached {
        Cached {
            warm: m.deep_clone(),
            cold: m,
            uses: 0,
        }
    }

    /// A matcher for one request, sharing the warm lexer.
    fn take(&mut self) -> Matcher {
        self.uses += 1;
        if self.uses > WARM_USES {
            self.warm = self.cold.deep_clone();
            self.uses = 1;
        }
        self.warm.clone()
    }
}

/// A model's tokens for constrained generation: compile a [`ConstraintSpec`]
/// with [`TokenSpace::compile`].
pub struct TokenSpace {
    factory: ParserFactory,
    vocab: usize,
    eos: u32,
    /// Grammars compiled before, by the grammar's JSON.
    cache: std::sync::Mutex<std::collections::HashMap<String, Cached>>,
    /// Whether a token crosses between the parts of an `auto` tool call, by
    /// markers.
    crossed: std::sync::Mutex<std::collections::HashMap<(String, String), bool>>,
}

impl std::fmt::Debug for TokenSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSpace")
            .field("vocab", &self.vocab)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl TokenSpace {
    /// The token space of `model`'s embedded tokenizer (`cqlm.tokenizer`), with
    /// its BOS, EOS and vocabulary size. Ids the tokenizer does not name (a model
    /// vocabulary larger than the tokenizer's) become special tokens no constraint
    /// allows.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the archive has no tokenizer, it does not
    /// parse, llguidance cannot read its tokens, or it names more tokens than the
    /// model has.
    pub fn for_model(model: &Model) -> Result<Arc<TokenSpace>> {
        let text = model.tokenizer.as_deref().ok_or_else(|| {
            Error::InvalidArgument(
                "constrained generation needs the archive's tokenizer (cqlm.tokenizer), and this archive has none".into(),
            )
        })?;
        let bad = |e: String| Error::InvalidArgument(format!("cqlm.tokenizer: {e}"));
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| bad(format!("llguidance cannot read its tokens: {e}")))?;
        let c = &model.config;
        if words.len() > c.vocab {
            return Err(bad(format!(
                "it names {} tokens, the model has {}",
                words.len(),
                c.vocab
            )));
        }
        for id in words.len()..c.vocab {
            // The special-token marker and a name: never produced by text.
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            w.extend_from_slice(format!("<[{id}]>").as_bytes());
            words.push(w);
        }
        let hf = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| bad(e.to_string()))?;
        let mut info = TokRxInfo::new(c.vocab as u32, c.eos);
        info.tok_bos = Some(c.bos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, hf });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| bad(format!("llguidance: {e}")))?;
        factory.quiet();
        Ok(Arc::new(TokenSpace {
            factory,
            vocab: c.vocab,
            eos: c.eos,
            cache: Default::default(),
            crossed: Default::default(),
        }))
    }

    /// Compile `spec` into a fresh [`Constraint`] (once per request). A grammar
    /// compiled before (the same tool set or schema, and the parts of `auto` tool
    /// calls that depend only on the markers) is copied from the cache, not
    /// compiled again, and shares the lexer states earlier requests built.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the cause when the schema, pattern,
    /// grammar or tool set cannot be compiled (malformed, or a feature llguidance
    /// does not support).
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constraint> {
        let (grammars, kind) = spec.grammar()?;
        let what = spec.what();
        let (first, rest) = match grammars {
            Grammars::One(g) => (self.matcher(g, what)?, Vec::new()),
            Grammars::Call(c) if self.crossed(c.markers()) => {
                (self.matcher(c.whole(), what)?, Vec::new())
            }
            Grammars::Call(c) => {
                // The call first: it is the part a bad tool set fails in.
                let call = self.matcher(c.call(), what)?;
                let head = self.matcher(c.head(), what)?;
                (head, vec![call, self.matcher(c.end(), what)?])
            }
        };
        Ok(Constraint::new(first, rest, kind, self.vocab, self.eos))
    }

    /// A matcher of `grammar`, from the cache or compiled (and cached).
    fn matcher(&self, grammar: TopLevelGrammar, what: &str) -> Result<Matcher> {
        let key = serde_json::to_string(&grammar).ok();
        let cache = || self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = key
            .as_ref()
            .and_then(|k| cache().get_mut(k).map(Cached::take))
        {
            return Ok(m);
        }
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::InvalidArgument(format!("{what}: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::InvalidArgument(format!("{what}: {e}")));
        }
        let Some(k) = key else {
            return Ok(matcher);
        };
        let mut c = cache();
        if c.len() >= CACHED_GRAMMARS {
            c.clear();
        }
        let mut cached = Cached::new(matcher);
        let m = cached.take();
        c.insert(k, cached);
        Ok(m)
    }

    /// Whether a token of the vocabulary could cross between the parts of an
    /// `auto` tool call with these markers ([`CallGrammars::crossed_by`]); worked
    /// out once per pair of markers.
    fn crossed(&self, markers: &ToolMarkers) -> bool {
        let mut known = self.crossed.lock().unwrap_or_else(|e| e.into_inner());
        let key = (markers.start.clone(), markers.end.clone());
        *known.entry(key).or_insert_with(|| {
            let trie = self.factory.tok_env().tok_trie();
            (0..trie.vocab_size() as u32).any(|t| CallGrammars::crossed_by(markers, trie.token(t)))
        })
    }

    /// The vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The id that ends generation where the constraint accepts.
    pub fn eos(&self) -> u32 {
        self.eos
    }
}

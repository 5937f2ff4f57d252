//! Text ↔ token ids through the archive's embedded Hugging Face `tokenizer.json`
//! (`cqlm.tokenizer`, SPEC §5), parsed only when text is tokenized.

use crate::error::{Error, Result};
use crate::weights::Model;

/// A parsed tokenizer with the model's BOS id.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    bos: u32,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("bos", &self.bos)
            .finish_non_exhaustive()
    }
}

impl TextTokenizer {
    /// Parse the model's embedded tokenizer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the archive has none or it does not parse.
    pub fn for_model(model: &Model) -> Result<TextTokenizer> {
        let text = model.tokenizer.as_deref().ok_or_else(|| {
            Error::InvalidArgument(
                "this archive has no embedded tokenizer (cqlm.tokenizer): give token ids instead of text".into(),
            )
        })?;
        let inner = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| Error::InvalidArgument(format!("cqlm.tokenizer does not parse: {e}")))?;
        Ok(TextTokenizer {
            inner,
            bos: model.config.bos,
        })
    }

    /// Token ids of `text`, with the tokenizer's special tokens, and BOS in front
    /// when its post-processor does not put it there.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the tokenizer fails on the text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| Error::InvalidArgument(format!("cannot tokenize the prompt: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if ids.first() != Some(&self.bos) {
            ids.insert(0, self.bos);
        }
        Ok(ids)
    }

    /// Text of `ids` (special tokens skipped).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if an id is unknown to the tokenizer.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::InvalidArgument(format!("cannot decode ids: {e}")))
    }

    /// The text of token `id` as the vocabulary names it (special tokens too;
    /// empty for an unknown id), e.g. the `bos_token` of a chat template.
    pub fn decode_special(&self, id: u32) -> String {
        self.inner.id_to_token(id).unwrap_or_default()
    }
}

/// Generated text as it grows, for streaming: each [`TextStream::push`] hands
/// out the new text, never a partial character and never what could still
/// become one of the stop strings; the text ends at the first stop string.
pub struct TextStream<'a> {
    tok: &'a TextTokenizer,
    stops: Vec<String>,
    ids: Vec<u32>,
    sent: usize,
    stopped_at: Option<usize>,
}

impl<'a> TextStream<'a> {
    /// No text yet, with these stop strings.
    pub fn new(tok: &'a TextTokenizer, stops: Vec<String>) -> TextStream<'a> {
        TextStream {
            tok,
            stops,
            ids: Vec::new(),
            sent: 0,
            stopped_at: None,
        }
    }

    /// Tokens pushed.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether a stop string has appeared.
    pub fn stopped(&self) -> bool {
        self.stopped_at.is_some()
    }

    /// Add `id`; the new text that may be sent.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            self.stopped_at = Some(at);
            return Ok(self.take(&text, at));
        }
        let hold = self
            .stops
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        let mut end = text.len().saturating_sub(hold);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Ok(self.take(&text, end))
    }

    fn take(&mut self, text: &str, end: usize) -> Option<String> {
        (end > self.sent && text.is_char_boundary(self.sent)).then(|| {
            let s = text[self.sent..end].to_string();
            self.sent = end;
            s
        })
    }

    /// The text not handed out yet (up to a stop string): what a stream prints
    /// at its end.
    pub fn rest(&self) -> Result<String> {
        let full = self.full()?;
        Ok(full.get(self.sent..).unwrap_or_default().to_string())
    }

    /// The whole text (up to a stop string).
    pub fn full(&self) -> Result<String> {
        let text = self.tok.decode(&self.ids)?;
        Ok(match self.stopped_at {
            Some(at) => text[..at].to_string(),
            None => text,
        })
    }
}

//! Text ↔ token ids through the archive's embedded Hugging Face `tokenizer.json`
//! (`cqlm.tokenizer`, SPEC §5), parsed only when text is tokenized.

use crate::error::{Error, Result};
use crate::model::weights::Model;

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
        Self::from_json(text, model.config.bos)
    }

    /// Parse a Hugging Face `tokenizer.json` whose BOS id is `bos`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when it does not parse.
    pub fn from_json(json: &str, bos: u32) -> Result<TextTokenizer> {
        let inner = json
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| Error::InvalidArgument(format!("cqlm.tokenizer does not parse: {e}")))?;
        Ok(TextTokenizer { inner, bos })
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

    /// Token ids of `text` as the tokenizer splits it, without BOS or the
    /// post-processor's special tokens (special tokens written in the text are
    /// still recognized).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the tokenizer fails on the text.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::InvalidArgument(format!("cannot tokenize the text: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The bytes token `id` stands for: an added (special) token's text, a
    /// byte-fallback token's byte (`<0xNN>`), a byte-level BPE token's bytes
    /// (GPT-2's byte-to-character table read backwards), else the token
    /// decoded alone. `None` for an id the tokenizer does not know.
    pub fn piece(&self, id: u32) -> Option<Vec<u8>> {
        if let Some(added) = self.inner.get_added_tokens_decoder().get(&id) {
            return Some(added.content.clone().into_bytes());
        }
        let tok = self.inner.id_to_token(id)?;
        if let Some(hex) = tok.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return Some(vec![b]);
            }
        }
        if matches!(
            self.inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        ) {
            if let Some(bytes) = tok.chars().map(byte_level_byte).collect() {
                return Some(bytes);
            }
        }
        self.inner.decode(&[id], false).ok().map(String::into_bytes)
    }

    /// The text of token `id` as the vocabulary names it (special tokens too;
    /// empty for an unknown id), e.g. the `bos_token` of a chat template.
    pub fn decode_special(&self, id: u32) -> String {
        self.inner.id_to_token(id).unwrap_or_default()
    }
}

/// The byte a character of a byte-level BPE token stands for: GPT-2's table
/// maps the printable bytes `!..=~`, `¡..=¬` and `®..=ÿ` to themselves and the
/// other 68, in order, to U+0100 onwards.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let c = c as u32;
    if c < 256 {
        return printable(c).then_some(c as u8);
    }
    let n = (c - 256) as usize;
    (0..=255u32)
        .filter(|&b| !printable(b))
        .nth(n)
        .map(|b| b as u8)
}

/// The `tokenizers` crate's incremental decoder over a [`TextTokenizer`].
type Decoder<'a> = tokenizers::DecodeStream<
    'a,
    tokenizers::ModelWrapper,
    tokenizers::NormalizerWrapper,
    tokenizers::PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

/// Generated text as it grows, for streaming: each [`TextStream::push`] hands
/// out the new text, never a partial character and never what could still
/// become one of the stop strings; the text ends at the first stop string.
/// Each token costs O(1) (the `tokenizers` crate's streaming decoder, which
/// decodes a window of the last few tokens), whatever the length of the text.
pub struct TextStream<'a> {
    tok: &'a TextTokenizer,
    decoder: Decoder<'a>,
    stops: Vec<String>,
    /// Bytes a stop string could still reach back from the end of the text.
    hold: usize,
    ids: Vec<u32>,
    /// The text of the ids decoded so far (whole characters).
    text: String,
    /// Whether the last ids have not produced text yet (a partial character).
    partial: bool,
    sent: usize,
    /// Where the first stop string starts in `text`, and which one it is.
    stopped_at: Option<(usize, usize)>,
}

impl<'a> TextStream<'a> {
    /// No text yet, with these stop strings.
    pub fn new(tok: &'a TextTokenizer, stops: Vec<String>) -> TextStream<'a> {
        let hold = stops
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        TextStream {
            tok,
            decoder: tok.inner.decode_stream(true),
            stops,
            hold,
            ids: Vec::new(),
            text: String::new(),
            partial: false,
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

    /// The stop string the text ended at (the earliest in the text; of two
    /// starting there, the first given), once [`TextStream::stopped`].
    pub fn stop_string(&self) -> Option<&str> {
        self.stopped_at.map(|(_, i)| self.stops[i].as_str())
    }

    /// Add `id`; the new text that may be sent.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the tokenizer cannot decode `id`.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        if self.stopped_at.is_some() {
            return Ok(None);
        }
        let piece = self
            .decoder
            .step(id)
            .map_err(|e| Error::InvalidArgument(format!("cannot decode ids: {e}")))?;
        let Some(piece) = piece else {
            self.partial = true;
            return Ok(None);
        };
        self.partial = false;
        // Earlier text holds no stop string: a new one ends in this piece.
        let mut from = self.text.len().saturating_sub(self.hold);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(&piece);
        if let Some((at, i)) = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((from + self.text[from..].find(s.as_str())?, i)))
            .min()
        {
            self.stopped_at = Some((at, i));
            return Ok(self.take(at));
        }
        let mut end = self.text.len().saturating_sub(self.hold);
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        Ok(self.take(end))
    }

    fn take(&mut self, end: usize) -> Option<String> {
        (end > self.sent).then(|| {
            let s = self.text[self.sent..end].to_string();
            self.sent = end;
            s
        })
    }

    /// The text not handed out yet (up to a stop string): what a stream prints
    /// at its end.
    ///
    /// # Errors
    /// As [`TextStream::full`].
    pub fn rest(&self) -> Result<String> {
        let full = self.full()?;
        Ok(full.get(self.sent..).unwrap_or_default().to_string())
    }

    /// The whole text (up to a stop string). Ids that end in a partial
    /// character come out as the tokenizer's whole decode shows them
    /// (U+FFFD for the incomplete bytes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the tokenizer cannot decode the ids.
    pub fn full(&self) -> Result<String> {
        Ok(match self.stopped_at {
            Some((at, _)) => self.text[..at].to_string(),
            None if self.partial => self.tok.decode(&self.ids)?,
            None => self.text.clone(),
        })
    }
}

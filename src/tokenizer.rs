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

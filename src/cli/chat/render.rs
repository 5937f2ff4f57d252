//! What the chat prints besides the answers' text: the stats line, notes and
//! errors (dim on a terminal), tool calls and results, and the filter that
//! keeps a tool call's raw text off the screen.

use super::turn::TurnStats;
use std::io::{IsTerminal, Write};

/// Where the chat's own lines go: stderr, dim when it is a terminal.
#[derive(Debug, Clone, Copy)]
pub struct Notes {
    dim: bool,
}

impl Notes {
    /// Lines on stderr, dim when stderr is a terminal.
    pub fn new() -> Notes {
        Notes {
            dim: std::io::stderr().is_terminal(),
        }
    }

    /// Print `line` (dim on a terminal).
    pub fn note(&self, line: &str) {
        let mut err = std::io::stderr().lock();
        let _ = if self.dim {
            writeln!(err, "\x1b[2m{line}\x1b[0m")
        } else {
            writeln!(err, "{line}")
        };
    }

    /// Print `error: {msg}` (never dim).
    pub fn error(&self, msg: &str) {
        eprintln!("error: {}", msg.replace('\n', " "));
    }
}

/// The stats line of one answer: prompt tokens, those cached from the
/// previous turn, tokens generated, time to the first token and decode speed.
pub fn stats_line(s: &TurnStats) -> String {
    let first = match s.first_token {
        Some(d) => format!("{:.0} ms", d.as_secs_f64() * 1e3),
        None => "-".into(),
    };
    format!(
        "[prompt {} tokens, {} cached | {} generated | first token {first} | {:.1} tok/s]",
        s.prompt,
        s.cached,
        s.generated,
        s.tokens_per_second()
    )
}

/// The line of a tool call: `→ name(arguments)`.
pub fn call_line(name: &str, arguments: &str) -> String {
    format!("→ {name}({arguments})")
}

/// The line of a tool's result: `← result`.
pub fn result_line(result: &str) -> String {
    format!("← {result}")
}

/// Holds back an answer's text while it may still be the start of a tool
/// call (it begins with the call marker): a call is printed as its
/// [`call_line`], not as the model's raw text.
#[derive(Debug)]
pub struct CallFilter {
    marker: Option<String>,
    held: String,
    /// `Some(true)`: text, streamed; `Some(false)`: a call, hidden.
    decided: Option<bool>,
}

impl CallFilter {
    /// A filter for calls that begin with `marker` (`None`: no tools, all text).
    pub fn new(marker: Option<&str>) -> CallFilter {
        let marker = marker.filter(|m| !m.is_empty()).map(str::to_string);
        let decided = marker.is_none().then_some(true);
        CallFilter {
            marker,
            held: String::new(),
            decided,
        }
    }

    /// Take `text`; what may be printed now.
    pub fn push(&mut self, text: &str) -> String {
        match self.decided {
            Some(true) => return text.to_string(),
            Some(false) => return String::new(),
            None => {}
        }
        self.held.push_str(text);
        let marker = self.marker.as_deref().unwrap_or_default();
        let start = self.held.trim_start();
        if start.starts_with(marker) {
            self.decided = Some(false);
            String::new()
        } else if marker.starts_with(start) {
            String::new()
        } else {
            self.decided = Some(true);
            std::mem::take(&mut self.held)
        }
    }

    /// At the end of the answer: what is still held, unless it is a call.
    pub fn finish(&mut self) -> String {
        if self.decided == Some(false) {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Whether anything has been let through.
    pub fn printed_text(&self) -> bool {
        self.decided == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_held_back_and_text_streams() {
        let mut f = CallFilter::new(Some("<tool_call>"));
        assert_eq!(f.push("<tool"), "");
        assert_eq!(f.push("_call>{"), "");
        assert_eq!(f.finish(), "");
        let mut f = CallFilter::new(Some("<tool_call>"));
        assert_eq!(f.push("<t"), "");
        assert_eq!(f.push("he"), "<the");
        assert_eq!(f.push(" end"), " end");
        let mut f = CallFilter::new(None);
        assert_eq!(f.push("<tool_call>"), "<tool_call>");
    }
}

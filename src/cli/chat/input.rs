//! Where the chat's lines come from: a line editor with history on a
//! terminal (rustyline), else standard input line by line.

use anyhow::Result;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use std::io::BufRead;

/// One read.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line (without its newline).
    Text(String),
    /// Ctrl-C at the prompt: the line was cleared.
    Interrupted,
    /// Ctrl-D or the end of the input.
    Eof,
}

/// The source of lines.
pub enum Input {
    /// A terminal: rustyline with its history in memory.
    Editor(Box<DefaultEditor>),
    /// Piped standard input: no prompt, no editing.
    Piped(std::io::StdinLock<'static>),
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Input::Editor(_) => "Input::Editor",
            Input::Piped(_) => "Input::Piped",
        })
    }
}

impl Input {
    /// The line editor when `interactive`, else standard input.
    ///
    /// # Errors
    /// The editor cannot take the terminal.
    pub fn new(interactive: bool) -> Result<Input> {
        Ok(if interactive {
            Input::Editor(Box::new(DefaultEditor::new()?))
        } else {
            Input::Piped(std::io::stdin().lock())
        })
    }

    /// Read a line after `prompt` (shown only by the editor), adding a
    /// non-empty one to the history when `remember`.
    ///
    /// # Errors
    /// Reading fails (not Ctrl-C or the end of the input).
    pub fn read(&mut self, prompt: &str, remember: bool) -> Result<Line> {
        match self {
            Input::Editor(ed) => match ed.readline(prompt) {
                Ok(line) => {
                    if remember && !line.trim().is_empty() {
                        let _ = ed.add_history_entry(line.as_str());
                    }
                    Ok(Line::Text(line))
                }
                Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
                Err(ReadlineError::Eof) => Ok(Line::Eof),
                Err(e) => Err(e.into()),
            },
            Input::Piped(stdin) => {
                let mut line = String::new();
                if stdin.read_line(&mut line)? == 0 {
                    return Ok(Line::Eof);
                }
                let end = line.trim_end_matches(['\n', '\r']).len();
                line.truncate(end);
                Ok(Line::Text(line))
            }
        }
    }
}

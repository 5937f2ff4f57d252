//! The chat's slash commands, parsed from an input line.

/// A slash command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/reset`: clear the conversation and the engine's state.
    Reset,
    /// `/system [TEXT]`: set the system prompt (show it without text).
    System(Option<String>),
    /// `/tools FILE|demo|off`: the tools offered (show them without an argument).
    Tools(Option<String>),
    /// `/stats`: totals, seed, backend, context use.
    Stats,
    /// `/save FILE`: the conversation as JSON (OpenAI messages).
    Save(Option<String>),
    /// `/exit` or `/quit`.
    Exit,
    /// `/help`.
    Help,
    /// Anything else that starts with `/`: the name as typed.
    Unknown(String),
}

/// The help text of `/help`.
pub const HELP: &str = "\
/reset            clear the conversation and the engine's state
/system [TEXT]    set the system prompt (without TEXT: show it)
/tools FILE|demo|off  offer an OpenAI tools array from FILE, the four demo tools, or none
/stats            totals, seed, backend and context use
/save FILE        write the conversation as JSON (OpenAI messages)
/exit             quit (also Ctrl-D); Ctrl-C stops an answer or clears the line
/help             this list";

/// The command `line` holds, `None` when it is not one (no leading `/`).
pub fn parse(line: &str) -> Option<Command> {
    let line = line.trim();
    let rest = line.strip_prefix('/')?;
    let (name, arg) = match rest.split_once(char::is_whitespace) {
        Some((n, a)) => (n, Some(a.trim().to_string()).filter(|a| !a.is_empty())),
        None => (rest, None),
    };
    Some(match name {
        "reset" | "clear" => Command::Reset,
        "system" => Command::System(arg),
        "tools" => Command::Tools(arg),
        "stats" => Command::Stats,
        "save" => Command::Save(arg),
        "exit" | "quit" => Command::Exit,
        "help" | "?" => Command::Help,
        _ => Command::Unknown(format!("/{name}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_arguments() {
        assert_eq!(parse("hello"), None);
        assert_eq!(parse("/reset"), Some(Command::Reset));
        assert_eq!(
            parse("/system  be brief "),
            Some(Command::System(Some("be brief".into())))
        );
        assert_eq!(parse("/tools"), Some(Command::Tools(None)));
        assert_eq!(parse("/frob x"), Some(Command::Unknown("/frob".into())));
    }
}

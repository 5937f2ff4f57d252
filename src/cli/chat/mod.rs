//! `cqlm chat`: an interactive chat in the terminal over the archive's chat
//! template, with streamed answers, a line editor, slash commands, tools run
//! in-process, the conversation kept within the context, and each turn
//! prefilling only the tokens that neither the engine's state nor a state
//! kept after an earlier prompt holds ([`turn`]). With standard
//! input piped: one exchange per line, answers on stdout one per line.

mod commands;
mod conversation;
mod input;
mod quiet;
mod render;
mod tools;
mod turn;

use super::{BackendArgs, ModelArgs};
use anyhow::{bail, Result};
use commands::Command;
use conversation::{Conversation, Renderer};
use cqlm::constrain::TokenSpace;
use cqlm::session::sample::{Sampler, SamplerConfig};
use cqlm::session::tokenizer::TextTokenizer;
use cqlm::session::Session;
use input::{Input, Line};
use render::{CallFilter, Notes};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tools::Tools;
use turn::{Chatter, TurnStats};

/// `cqlm chat`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "Commands inside the chat:\n".to_string() + commands::HELP)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// System prompt (it never falls out of the context).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Tools the model may call: an OpenAI tools array in a JSON file, or `demo`
    /// (the four tools the built-in model was trained on, run in-process);
    /// default: none.
    #[arg(long, value_name = "FILE|demo")]
    tools: Option<String>,
    /// Most tokens per answer.
    #[arg(long, value_name = "N", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: u32,
    /// Context in tokens: older turns fall out when the conversation and the
    /// answer's room (--max-tokens, at most half the context) would exceed it.
    /// Default: what the model attends to (its sink plus its sliding window).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(8..))]
    ctx_tokens: Option<u32>,
    /// MiB of states kept after earlier turns' prompts, so that a prompt
    /// extending one prefills only the rest (least recently used out first;
    /// on a GPU, device memory; 0: none).
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    cache_mb: u64,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample only among the k most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample only among the most likely tokens whose probability reaches p.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Sample only among tokens at least this likely relative to the most likely one (0: off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalise tokens seen in the last 64 (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Sampling seed (default: a random one, shown by /stats).
    #[arg(long)]
    seed: Option<u64>,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Set by Ctrl-C during an answer: the answer stops at its next token.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Tool round trips in one exchange before the model must answer in text.
const MAX_TOOL_ROUNDS: usize = 4;

/// Totals over the chat (`/stats`).
#[derive(Debug, Default)]
struct Totals {
    answers: usize,
    prompt: usize,
    cached: usize,
    generated: usize,
}

/// The chat's state.
struct Chat {
    model: Arc<cqlm::Model>,
    renderer: Renderer,
    space: Arc<TokenSpace>,
    chatter: Chatter,
    conv: Conversation,
    tools: Tools,
    notes: Notes,
    interactive: bool,
    max_tokens: usize,
    ctx: usize,
    seed: u64,
    totals: Totals,
}

/// Run `cqlm chat`.
///
/// # Errors
/// A model, backend or tools file that cannot be loaded, or no tokenizer.
pub fn run(a: Args) -> Result<()> {
    a.backend.check()?;
    let interactive = std::io::stdin().is_terminal();
    let tools = match &a.tools {
        Some(t) => Tools::parse(t)?,
        None => Tools::Off,
    };
    let model = a.model.load()?;
    if model.tokenizer.is_none() {
        bail!("this archive has no embedded tokenizer (cqlm.tokenizer): chat needs one");
    }
    let renderer = Renderer::new(&model, TextTokenizer::for_model(&model)?)?;
    let space = TokenSpace::for_model(&model)?;
    let seed = a.seed.unwrap_or_else(rand::random);
    let sampler = Sampler::new(SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        seed,
        ..SamplerConfig::default()
    })?;
    // Drivers may write to stderr while wgpu probes them; the chat's stderr
    // holds only its own lines (the notice below says what auto chose).
    let builder = a.backend.builder(Arc::clone(&model), cqlm::Precision::Fast);
    let session = quiet::without_stderr(|| Session::from_builder(builder))?;
    super::report_notice(session.fallback_reason(), true);
    let (eos, vocab) = (model.config.eos, model.config.vocab);
    let ctx = a
        .ctx_tokens
        .map_or(model.config.sink + model.config.window, |n| n as usize);
    let mut chat = Chat {
        renderer,
        space,
        chatter: Chatter::new(session, sampler, a.cache_mb << 20, eos, vocab),
        conv: Conversation::new(a.system.clone()),
        tools,
        notes: Notes::new(),
        interactive,
        max_tokens: a.max_tokens as usize,
        ctx,
        seed,
        totals: Totals::default(),
        model,
    };
    if interactive {
        let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
        chat.notes.note(&format!(
            "cqlm chat: {} on {} | context {ctx} tokens | tools {} | /help for commands, Ctrl-D to quit",
            a.model.id(),
            chat.chatter.session.engine().describe(),
            chat.tools.describe()
        ));
    }
    let mut input = Input::new(interactive)?;
    let failed = chat.repl(&mut input)?;
    if failed && !interactive {
        // Piped: the errors were reported line by line; the status says so.
        std::process::exit(1);
    }
    Ok(())
}

impl Chat {
    /// Read and answer lines until `/exit` or the end of the input; whether
    /// any line failed.
    fn repl(&mut self, input: &mut Input) -> Result<bool> {
        let mut failed = false;
        loop {
            let line = match input.read("> ", true)? {
                Line::Text(l) => l,
                Line::Interrupted => continue,
                Line::Eof => return Ok(failed),
            };
            let text = line.trim();
            if text.is_empty() {
                continue;
            }
            let ok = match commands::parse(text) {
                Some(Command::Exit) => return Ok(failed),
                Some(cmd) => self.command(cmd),
                None => self.exchange_or_undo(input, text),
            };
            failed |= !ok;
        }
    }

    /// A command's output: stdout on a terminal, stderr when piped (stdout
    /// holds only the answers).
    fn say(&self, text: &str) {
        if self.interactive {
            println!("{text}");
        } else {
            self.notes.note(text);
        }
    }

    /// Run a slash command; false (with an error line) when it failed.
    fn command(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Reset => {
                self.conv.clear();
                self.chatter.reset();
                self.say("[conversation cleared]");
            }
            Command::System(None) => {
                let s = self.conv.system.as_deref().unwrap_or("(none)");
                self.say(&format!("system: {s}"));
            }
            Command::System(Some(text)) => {
                self.conv.system = Some(text);
                self.say("[system prompt set]");
            }
            Command::Tools(None) => self.say(&format!("tools: {}", self.tools.describe())),
            Command::Tools(Some(arg)) => match Tools::parse(&arg) {
                Ok(t) => {
                    self.tools = t;
                    self.say(&format!("tools: {}", self.tools.describe()));
                }
                Err(e) => {
                    self.notes.error(&format!("{e:#}"));
                    return false;
                }
            },
            Command::Stats => self.say(&self.stats()),
            Command::Save(None) => {
                self.notes.error("/save needs a file name");
                return false;
            }
            Command::Save(Some(path)) => {
                let json = serde_json::Value::Array(self.conv.messages());
                let text = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
                if let Err(e) = std::fs::write(&path, text) {
                    self.notes.error(&format!("cannot write {path}: {e}"));
                    return false;
                }
                self.say(&format!(
                    "[saved {} messages to {path}]",
                    json.as_array().map_or(0, Vec::len)
                ));
            }
            Command::Help => self.say(commands::HELP),
            Command::Unknown(name) => {
                self.notes
                    .error(&format!("unknown command {name} (/help lists them)"));
                return false;
            }
            Command::Exit => {}
        }
        true
    }

    /// `/stats`: totals, seed, backend, context use.
    fn stats(&self) -> String {
        let t = &self.totals;
        format!(
            "turns {} | answers {} | prompt {} tokens, {} cached | generated {} | seed {} | {} | context {}/{} tokens | tools {}",
            self.conv.turns(),
            t.answers,
            t.prompt,
            t.cached,
            t.generated,
            self.seed,
            self.chatter.session.engine().describe(),
            self.chatter.session.tokens().len(),
            self.ctx,
            self.tools.describe()
        )
    }

    /// [`Chat::exchange`]; on an error, say so, and take the conversation
    /// and the engine back to before the line. False on an error.
    fn exchange_or_undo(&mut self, input: &mut Input, text: &str) -> bool {
        let before = self.conv.clone();
        match self.exchange(input, text) {
            Ok(()) => true,
            Err(e) => {
                self.notes.error(&format!("{e:#}"));
                self.conv = before;
                self.chatter.reset();
                false
            }
        }
    }

    /// The user says `text`: answer it, running the tools the model calls
    /// and answering again after their results.
    fn exchange(&mut self, input: &mut Input, text: &str) -> Result<()> {
        INTERRUPTED.store(false, Ordering::SeqCst);
        let mut start = Instant::now();
        self.conv.push_user(text);
        for round in 0..=MAX_TOOL_ROUNDS {
            let tools = if round < MAX_TOOL_ROUNDS {
                self.tools.clone()
            } else {
                Tools::Off
            };
            let array = tools.array();
            let room = self.max_tokens.min(self.ctx / 2);
            let fitted = self
                .renderer
                .fit(&mut self.conv, array.as_ref(), self.ctx, room)?;
            match fitted.dropped {
                0 => {}
                1 => self.notes.note("[1 old turn fell out of the context]"),
                n => self
                    .notes
                    .note(&format!("[{n} old turns fell out of the context]")),
            }
            let prompt = fitted.ids;
            if prompt.len() >= self.ctx {
                bail!(
                    "the conversation has {} tokens, more than the context's {} (--ctx-tokens)",
                    prompt.len(),
                    self.ctx
                );
            }
            let max = self.max_tokens.min(self.ctx - prompt.len());
            let constraint = tools.constraint(&self.space, &self.model.tool_markers)?;
            let marker = self.model.tool_markers.start.clone();
            let mut filter = CallFilter::new(constraint.is_some().then_some(marker.as_str()));
            let (output, stats) = {
                let stdout = std::io::stdout();
                let mut out = stdout.lock();
                let tok = self.renderer.tokenizer();
                let mut write_error = None;
                let r = self
                    .chatter
                    .answer(&prompt, max, constraint, tok, start, |t| {
                        let shown = filter.push(t);
                        if !shown.is_empty() {
                            if let Err(e) =
                                out.write_all(shown.as_bytes()).and_then(|_| out.flush())
                            {
                                write_error = Some(e);
                                return false;
                            }
                        }
                        !INTERRUPTED.load(Ordering::SeqCst)
                    })?;
                if let Some(e) = write_error {
                    return Err(e.into());
                }
                let tail = filter.finish();
                out.write_all(tail.as_bytes())?;
                if filter.printed_text() || !tail.is_empty() || r.0.tool_calls.is_empty() {
                    writeln!(out)?;
                }
                out.flush()?;
                r
            };
            self.count(&stats);
            let interrupted = INTERRUPTED.load(Ordering::SeqCst);
            if output.tool_calls.is_empty() || interrupted {
                self.conv.push_assistant(&output.text);
                if interrupted {
                    self.notes.note("[answer interrupted]");
                }
                return Ok(());
            }
            let before = output
                .text
                .find(&marker)
                .map_or("", |i| output.text[..i].trim());
            let calls: Vec<(String, String)> = output
                .tool_calls
                .iter()
                .map(|c| {
                    let args = serde_json::to_string(&c.arguments).unwrap_or_default();
                    (c.name.clone(), args)
                })
                .collect();
            let ids = self.conv.push_calls(before, &calls);
            for ((name, args), id) in calls.iter().zip(&ids) {
                self.say(&render::call_line(name, args));
                let result = self.tool_result(input, name, args)?;
                self.say(&render::result_line(&result));
                self.conv.push_tool_result(id, &result);
            }
            start = Instant::now();
        }
        Ok(())
    }

    /// The result of calling `name`: a demo tool runs in-process, any other
    /// asks the user (the next line of piped input).
    fn tool_result(&mut self, input: &mut Input, name: &str, args: &str) -> Result<String> {
        if cqlm::demo_tools::is_demo_tool(name) {
            return Ok(cqlm::demo_tools::call(name, args));
        }
        if !self.interactive {
            self.notes.note(&format!(
                "[{name} is not a demo tool: its result is the next input line]"
            ));
        }
        match input.read(&format!("result of {name}> "), false)? {
            Line::Text(t) => Ok(t),
            Line::Interrupted | Line::Eof => bail!("no result for the call of {name}"),
        }
    }

    /// Print `stats` as the answer's stats line and add them to the totals.
    fn count(&mut self, stats: &TurnStats) {
        self.notes.note(&render::stats_line(stats));
        let t = &mut self.totals;
        t.answers += 1;
        t.prompt += stats.prompt;
        t.cached += stats.cached;
        t.generated += stats.generated;
    }
}

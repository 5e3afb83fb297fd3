//! Compaction: a conversation that no longer fits the model's context has its
//! older turns summarised by the model into one message, recent turns kept whole.

use lemon_core::tool::ToolSpec;

use crate::llm::ChatMessage;

/// A request over this share of the context window is compacted first.
pub const COMPACT_AT: f64 = 0.9;

/// The recent turns kept whole take at most this share of the window.
const KEEP_SHARE: f64 = 0.3;

/// What the summary request tells the model.
pub const SUMMARY_SYSTEM: &str = "You summarise conversations between a user and a coding agent. \
Write a concise summary that keeps every fact, decision, file name, command and open task the \
agent needs to continue the work. Answer with the summary only.";

/// The text the summary is given back to the model as.
pub const SUMMARY_PREFIX: &str = "Summary of the earlier conversation:\n";

/// Tokens one image is counted as, whatever its size: about what the
/// providers charge for a picture scaled to their largest (Anthropic's
/// ~1,600 for 1.15 megapixels; OpenAI's high detail at most ~1,100). Its
/// base64 length, millions of characters, says nothing about that.
pub const IMAGE_TOKENS: u64 = 1600;

fn message_chars(message: &ChatMessage) -> usize {
    match message {
        ChatMessage::User { text, .. } => text.len(),
        ChatMessage::Assistant { text, tool_calls } => {
            text.len()
                + tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                    .sum::<usize>()
        }
        ChatMessage::ToolResult { call_id, name, content, .. } => {
            call_id.len() + name.len() + content.len()
        }
    }
}

/// Tokens of one message, estimated: four characters a token, plus framing,
/// plus [`IMAGE_TOKENS`] for each image.
pub fn message_tokens(message: &ChatMessage) -> u64 {
    (message_chars(message) / 4 + 4) as u64 + message.images().len() as u64 * IMAGE_TOKENS
}

/// Tokens a request of `system`, `messages` and `tools` takes, estimated.
pub fn estimate(system: Option<&str>, messages: &[ChatMessage], tools: &[ToolSpec]) -> u64 {
    estimate_with(system, messages, tool_tokens(tools))
}

/// The tokens `tools` add to every request: their names, descriptions and
/// schemas as sent.
pub fn tool_tokens(tools: &[ToolSpec]) -> u64 {
    let chars: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    (chars / 4) as u64
}

/// [`estimate`] with the tools' share already counted by [`tool_tokens`].
pub fn estimate_with(system: Option<&str>, messages: &[ChatMessage], tool_tokens: u64) -> u64 {
    let system = system.map_or(0, str::len) / 4;
    system as u64 + tool_tokens + messages.iter().map(message_tokens).sum::<u64>()
}

/// How many tokens of recent turns a compaction keeps whole: a share of the
/// window, and at most half of the conversation when the provider refused it
/// (`forced`) although the estimate fit.
pub fn keep_budget(window: u64, estimate: u64, forced: bool) -> u64 {
    let share = (window as f64 * KEEP_SHARE) as u64;
    if forced {
        share.min(estimate / 2)
    } else {
        share
    }
}

/// Where to cut `messages` to keep about `keep_budget` tokens of recent turns:
/// the messages before the index are summarised, the rest kept. The kept part
/// starts at a user or an assistant message (a tool result stays with its call)
/// and holds at least the last message. `None` when nothing older can be
/// summarised.
pub fn split_point(messages: &[ChatMessage], keep_budget: u64) -> Option<usize> {
    let mut kept = 0u64;
    let mut cut = messages.len();
    while cut > 0 {
        let tokens = message_tokens(&messages[cut - 1]);
        if cut < messages.len() && kept + tokens > keep_budget {
            break;
        }
        kept += tokens;
        cut -= 1;
    }
    // Never start the kept part with a tool result: its call goes with it.
    while cut > 0 && cut < messages.len() && matches!(messages[cut], ChatMessage::ToolResult { .. })
    {
        cut -= 1;
    }
    while cut < messages.len() && matches!(messages[cut], ChatMessage::ToolResult { .. }) {
        cut += 1;
    }
    (cut > 0 && cut < messages.len()).then_some(cut)
}

/// The older messages as a transcript for the summary request, at most
/// `max_chars` long (the oldest part dropped first).
pub fn transcript(messages: &[ChatMessage], max_chars: usize) -> String {
    let mut out = String::new();
    for message in messages {
        match message {
            ChatMessage::User { text, images } => {
                out.push_str("User: ");
                out.push_str(text);
                for image in images {
                    match &image.path {
                        Some(path) => out.push_str(&format!("\n[image {}]", path.display())),
                        None => out.push_str("\n[image]"),
                    }
                }
            }
            ChatMessage::Assistant { text, tool_calls } => {
                out.push_str("Assistant: ");
                out.push_str(text);
                for call in tool_calls {
                    out.push_str(&format!("\n[called {} with {}]", call.name, call.arguments));
                }
            }
            ChatMessage::ToolResult { name, content, is_error, .. } => {
                let state = if *is_error { "error" } else { "result" };
                out.push_str(&format!("[{name} {state}] {content}"));
            }
        }
        out.push_str("\n\n");
    }
    if out.len() > max_chars {
        let mut start = out.len() - max_chars;
        while !out.is_char_boundary(start) {
            start += 1;
        }
        out = out[start..].to_owned();
    }
    out
}

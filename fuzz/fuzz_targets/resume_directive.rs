//! Resume lines and directives: what the router takes out of a prompt before
//! it runs (`strip_prompt`: a pasted `claude --resume <id>`, `codex resume
//! <id>`, … line, then a leading `/<engine>` directive), slash commands and
//! engine references, over the engine table a default config registers.
//!
//! Properties: a resume line found is gone from the prompt, which is never
//! blank; the line the engine formats for that token reads back to the same
//! token, alone and inside a message; a directive's prompt is trimmed and not
//! blank; an engine reference prints back to itself.
#![no_main]

use std::sync::OnceLock;

use lemon_core::engine::{EngineRegistry, Field};
use lemon_core::router::resolve::{
    extract_resume_line, parse_directive, parse_engine_ref, parse_slash_command, strip_prompt,
    CONTINUE_PROMPT,
};
use lemon_engines::cli::CliContext;
use lemon_engines::config::EngineSections;
use libfuzzer_sys::fuzz_target;

fn engines() -> &'static EngineRegistry {
    static ENGINES: OnceLock<EngineRegistry> = OnceLock::new();
    ENGINES.get_or_init(|| {
        let ctx = CliContext { search_path: Some(String::new()), ..CliContext::default() };
        lemon_engines::build_registry(&EngineSections::default(), &ctx).expect("the engine table")
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let engines = engines();
    let _ = parse_slash_command(&text);
    for structured in [false, true] {
        for native_only in [false, true] {
            let stripped = strip_prompt(engines, &text, structured, native_only);
            assert!(!structured || stripped.resume.is_none());
            assert!(!native_only || stripped.directive.is_none());
        }
    }
    if let Some(found) = extract_resume_line(engines, &text) {
        assert!(!found.prompt.trim().is_empty(), "blank prompt");
        assert!(found.prompt == CONTINUE_PROMPT || found.prompt.trim() == found.prompt);
        assert!(
            text.lines().count() > found.prompt.lines().count() || found.prompt == CONTINUE_PROMPT
        );
        if engines.check_resume(&found.token).is_ok() {
            let line = engines.format_resume(&found.token);
            let again = extract_resume_line(engines, &line).map(|f| f.token);
            assert_eq!(again.as_ref(), Some(&found.token), "{line} does not read back");
            let message = format!("thanks\n{line}\nand go on");
            let again = extract_resume_line(engines, &message).expect("a resume line in a message");
            assert_eq!(again.token, found.token, "{line} in a message");
            assert_eq!(again.prompt, "thanks\nand go on");
        }
    }
    if let Some(Ok(directive)) = parse_directive(engines, &text) {
        assert!(!directive.prompt.is_empty() && directive.prompt.trim() == directive.prompt);
        let printed = directive.engine.to_string();
        assert_eq!(parse_engine_ref(&printed, Field::Prompt).as_ref(), Ok(&directive.engine));
    }
    let word = text.split_whitespace().next().unwrap_or("");
    if let Ok(engine) = parse_engine_ref(word, Field::Prompt) {
        assert_eq!(parse_engine_ref(&engine.to_string(), Field::Prompt).as_ref(), Ok(&engine));
    }
});

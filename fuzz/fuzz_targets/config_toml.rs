//! Config loading from TOML text: `lemon_core::config::load_str`, then the
//! engine sections (`lemon_engines::config::EngineSections::parse`).
//!
//! Properties: an error names the file and a position inside the text
//! (line within the lines, column within that line); a loaded config
//! serialises back to TOML that loads again and serialises to the same text.
#![no_main]

use std::path::Path;

use lemon_core::config::{load_str, ConfigError};
use lemon_engines::config::EngineSections;
use libfuzzer_sys::fuzz_target;

const PATH: &str = "/home/ana/.lemon/config.toml";

fn check_error(text: &str, error: &ConfigError) {
    let shown = error.to_string();
    assert!(shown.starts_with(PATH), "error without the file: {shown}");
    assert!(!shown.contains('\n'), "error on several lines: {shown:?}");
    if let Some(at) = error.position() {
        let lines: Vec<&str> = text.split('\n').collect();
        assert!(
            at.line >= 1 && at.line <= lines.len(),
            "line {} of {}: {shown}",
            at.line,
            lines.len()
        );
        let chars = lines[at.line - 1].chars().count();
        assert!(
            at.column >= 1 && at.column <= chars + 1,
            "column {} of {chars}: {shown}",
            at.column
        );
        assert!(shown.starts_with(&format!("{PATH}:{}:{}", at.line, at.column)), "{shown}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new(PATH);
    let loaded = match load_str(text, path) {
        Ok(loaded) => loaded,
        Err(error) => return check_error(text, &error),
    };
    for warning in &loaded.warnings {
        assert!(warning.starts_with(PATH), "warning without the file: {warning}");
    }
    if let Err(error) = EngineSections::parse(&loaded.config.gateway.engines, path, text) {
        check_error(text, &error);
    }
    let written = toml::to_string(&loaded.config).expect("a loaded config serialises");
    let again = match load_str(&written, path) {
        Ok(again) => again,
        Err(error) => panic!("the serialised config does not load: {error}\n{written}"),
    };
    let rewritten = toml::to_string(&again.config).expect("a loaded config serialises");
    assert_eq!(written, rewritten, "serialising is not stable");
});

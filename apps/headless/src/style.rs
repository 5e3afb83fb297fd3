//! Colour on the terminal: `--color auto|always|never`, with `auto` meaning
//! "the stream is a terminal and `NO_COLOR` is not set".

use std::collections::BTreeMap;

use clap::ValueEnum;

/// When to colour output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ColorChoice {
    /// Only on a terminal, and not when `NO_COLOR` is set.
    #[default]
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour a stream that is (`is_terminal`) a terminal or not.
    pub fn enabled(self, is_terminal: bool, env: &BTreeMap<String, String>) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                is_terminal && env.get("NO_COLOR").is_none_or(|value| value.is_empty())
            }
        }
    }
}

/// Paints text with ANSI colours, or leaves it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    pub color: bool,
}

impl Style {
    fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub fn green(self, text: &str) -> String {
        self.paint("32", text)
    }

    pub fn red(self, text: &str) -> String {
        self.paint("31", text)
    }

    pub fn yellow(self, text: &str) -> String {
        self.paint("33", text)
    }

    pub fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }

    pub fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_colours_a_terminal_unless_no_color_is_set() {
        let mut env = BTreeMap::new();
        assert!(ColorChoice::Auto.enabled(true, &env));
        assert!(!ColorChoice::Auto.enabled(false, &env));
        env.insert("NO_COLOR".to_owned(), "1".to_owned());
        assert!(!ColorChoice::Auto.enabled(true, &env));
        assert!(ColorChoice::Always.enabled(false, &env));
        assert!(!ColorChoice::Never.enabled(true, &BTreeMap::new()));
        env.insert("NO_COLOR".to_owned(), String::new());
        assert!(ColorChoice::Auto.enabled(true, &env), "an empty NO_COLOR does not count");
    }

    #[test]
    fn without_colour_text_is_unchanged() {
        assert_eq!(Style { color: false }.red("x"), "x");
        assert_eq!(Style { color: true }.red("x"), "\x1b[31mx\x1b[0m");
    }
}

//! The starter `config.toml` that `config init` writes, printed from the
//! schema: the main tables with every key that has a default (or an
//! example) commented out under its description, so the file loads as the
//! defaults and each line can be switched on where it is.

use serde_json::Value;

use super::markdown::{sections, toml_text, Key, Section};

/// The tables the starter file spells out; the others are listed at its end.
pub const STARTER_TABLES: [&str; 6] = [
    "[gateway]",
    "[gateway.api]",
    "[gateway.health]",
    "[gateway.queue]",
    "[gateway.sandbox]",
    "[gateway.retention]",
];

/// Where a commented line ends with this, its value is an example rather
/// than the default.
pub const EXAMPLE_MARK: &str = "# example";

const WIDTH: usize = 79;

/// The starter file; its first line points editors at `schema_file` (a path
/// relative to the file, or a URL).
pub fn render(schema: &Value, schema_file: &str) -> String {
    let all = sections(schema);
    let mut out = format!("#:schema {schema_file}\n");
    out.push_str(HEADER);
    for section in all.iter().filter(|s| STARTER_TABLES.contains(&s.header.as_str())) {
        out.push('\n');
        out.push_str(&section.header);
        out.push('\n');
        if section.depth > 0 {
            if let Some(description) = &section.description {
                out.push_str(&comment(description));
                out.push('\n');
            }
        }
        let mut first = true;
        for key in section.keys.iter().filter(|key| !key.reference) {
            let Some(line) = assignment(key) else { continue };
            if !first {
                out.push('\n');
            }
            first = false;
            out.push_str(&comment(&key.meaning));
            out.push_str(&line);
            out.push('\n');
        }
    }
    out.push('\n');
    out.push_str(&comment(&others(&all)));
    out
}

const HEADER: &str = "\
# Lemon Gateway's config.toml, written by `lemon-gateway config init`.
#
# Every key is optional. A commented-out key shows its default (or, marked
# `# example`, a value to start from); remove its `#` to set it.
# `lemon-gateway config reference` describes every key and table,
# `lemon-gateway config check` checks this file as a start would, and editors
# that read the `#:schema` line above check it as you type
# (`lemon-gateway config schema` prints the schema again after an upgrade).
";

/// `# key = value`, with the default, else the example; `None` for a key
/// with neither.
fn assignment(key: &Key) -> Option<String> {
    let name = &key.name;
    if let Some(default) = &key.default_value {
        return Some(format!("# {name} = {}", toml_text(default)));
    }
    let example = key.example.as_ref()?;
    Some(format!("# {name} = {}  {EXAMPLE_MARK}", toml_text(example)))
}

/// The tables under `[gateway]` the starter leaves out, as a closing note.
fn others(all: &[Section]) -> String {
    let rest: Vec<&str> = all
        .iter()
        .filter(|s| s.depth == 1 && !STARTER_TABLES.contains(&s.header.as_str()))
        .map(|s| s.header.as_str())
        .collect();
    format!("More tables, each described by `lemon-gateway config reference`: {}.", rest.join(", "))
}

/// `text` as comment lines of at most [`WIDTH`] characters, keeping its
/// paragraphs and list items.
fn comment(text: &str) -> String {
    let mut out = String::new();
    for (i, paragraph) in text.split("\n\n").enumerate() {
        if i > 0 {
            out.push_str("#\n");
        }
        for line in paragraph.lines() {
            let indent = if line.starts_with("- ") { "  " } else { "" };
            let mut current = String::from("#");
            let mut fresh = true;
            for word in line.split_whitespace() {
                let needed = current.chars().count() + 1 + word.chars().count();
                if !fresh && needed > WIDTH {
                    out.push_str(&current);
                    out.push('\n');
                    current = format!("# {indent}");
                    current.push_str(word);
                    continue;
                }
                current.push(' ');
                current.push_str(word);
                fresh = false;
            }
            out.push_str(&current);
            out.push('\n');
        }
    }
    out
}

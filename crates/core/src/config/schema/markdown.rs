//! The reference page of `config.toml`, printed from its schema: a section
//! per table (`[gateway]`, `[gateway.telegram.files]`, `[[gateway.bindings]]`),
//! each with a row per key giving its type, default, allowed values and
//! meaning, after a table of contents.

use std::fmt::Write as _;

use serde_json::Value;

/// One table of the file and its keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    /// The table's header as written in the file: `[gateway.api]`,
    /// `[[gateway.bindings]]`, `[gateway.projects.<name>]`.
    pub header: String,
    /// How deep it is under `[gateway]` (0 for `[gateway]` itself).
    pub depth: usize,
    pub description: Option<String>,
    pub keys: Vec<Key>,
}

/// One key of a table.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    /// `integer`, `list of strings`, `string or boolean`…
    pub kind: String,
    /// The default as TOML (`2`, `"127.0.0.1"`, `[]`), or `None` when the
    /// key has none (its meaning says what unset does).
    pub default: Option<String>,
    /// The key must be written.
    pub required: bool,
    /// Bounds and choices: `0 to 4096`, `` `sqlite`, `postgres` ``.
    pub allowed: Option<String>,
    pub meaning: String,
    /// A key read from the reference layout, for configs written for it.
    pub reference: bool,
    /// The default as a value, for the starter file.
    pub default_value: Option<Value>,
    /// An example value, for the starter file.
    pub example: Option<Value>,
}

/// The tables of the file, `[gateway]` first, each followed by the tables
/// under it; keys and tables in name order.
pub fn sections(schema: &Value) -> Vec<Section> {
    let mut out = Vec::new();
    let definitions = schema.get("definitions").cloned().unwrap_or(Value::Null);
    let walker = Walker { definitions: &definitions };
    if let Some(gateway) = schema.pointer("/properties/gateway") {
        walker.table(gateway, &[Step::Key("gateway".to_owned())], 0, None, &mut out);
    }
    out
}

/// The number of keys the reference documents.
pub fn key_count(sections: &[Section]) -> usize {
    sections.iter().map(|section| section.keys.len()).sum()
}

/// The reference page.
pub fn render(schema: &Value) -> String {
    let sections = sections(schema);
    let mut out = String::new();
    out.push_str(INTRO);
    out.push_str("\n## Contents\n\n");
    let mut anchors = Anchors::default();
    let anchored: Vec<(String, &Section)> =
        sections.iter().map(|section| (anchors.of(&section.header), section)).collect();
    for (anchor, section) in &anchored {
        let indent = "  ".repeat(section.depth);
        let _ = writeln!(out, "{indent}- [`{}`](#{anchor})", section.header);
    }
    for (anchor, section) in &anchored {
        let _ = write!(out, "\n<a id=\"{anchor}\"></a>\n\n## `{}`\n\n", section.header);
        if let Some(description) = &section.description {
            out.push_str(&prose(description));
            out.push_str("\n\n");
        }
        if section.keys.is_empty() {
            out.push_str("No keys of its own; its tables follow.\n");
            continue;
        }
        out.push_str("| Key | Type | Default | Allowed values | Meaning |\n");
        out.push_str("|---|---|---|---|---|\n");
        for key in &section.keys {
            let name = if key.reference {
                format!("`{}` (reference layout)", key.name)
            } else {
                format!("`{}`", key.name)
            };
            let default = match (&key.default, key.required) {
                (_, true) => "required".to_owned(),
                (Some(default), false) => format!("`{}`", default.replace('|', "\\|")),
                (None, false) => "unset".to_owned(),
            };
            let allowed = key.allowed.as_deref().map(cell).unwrap_or_default();
            let _ = writeln!(
                out,
                "| {name} | {} | {default} | {allowed} | {} |",
                cell(&key.kind),
                cell(&key.meaning)
            );
        }
    }
    out
}

const INTRO: &str = "\
# `config.toml` reference

<!-- Printed by `lemon-gateway config reference` from the config types; a test
fails when this page differs from what the code prints. Do not edit it by hand:
change the doc comments and run `LEMON_BLESS=1 cargo test -p lemon-gateway
reference_docs`. -->

Lemon Gateway reads `$LEMON_HOME/config.toml` (`~/.lemon/config.toml`, or the
file `--config` or `$LEMON_CONFIG` names). Every key is optional unless marked
*required*; a file that does not exist gives the defaults. A key the gateway
does not know is reported with its file, line and column (and the closest known
key) and otherwise ignored; a table it does not know is an error. Keys marked
*reference layout* are read for configs written for the reference gateway; a new
config uses the key they name.

`lemon-gateway config init` writes a commented starter file,
`lemon-gateway config check` checks a file as a start would, and
`lemon-gateway config schema` prints the JSON Schema this page is printed from
(also [`config.schema.json`](config.schema.json)), which editors with a TOML
language server use to check the file as you type.
";

/// One step of a key path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    /// A key of the user's choosing: `<name>`.
    Name(String),
    /// An entry of an array of tables.
    Each,
}

fn header(steps: &[Step]) -> String {
    let mut parts = Vec::new();
    for step in steps {
        match step {
            Step::Key(key) => parts.push(toml_key(key)),
            Step::Name(name) => parts.push(format!("<{name}>")),
            Step::Each => {}
        }
    }
    let path = parts.join(".");
    if matches!(steps.last(), Some(Step::Each)) {
        format!("[[{path}]]")
    } else {
        format!("[{path}]")
    }
}

/// `key` as a TOML key: bare when it can be, else quoted.
fn toml_key(key: &str) -> String {
    let bare =
        !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

struct Walker<'a> {
    definitions: &'a Value,
}

impl Walker<'_> {
    /// `schema` with its `$ref` (alone or as the one entry of an `allOf`)
    /// followed; the description of the outer schema wins.
    fn resolve(&self, schema: &Value) -> (Value, Option<String>) {
        let own = description(schema);
        let target = schema
            .get("$ref")
            .or_else(|| schema.pointer("/allOf/0/$ref"))
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/definitions/"))
            .and_then(|name| self.definitions.get(name));
        match target {
            Some(target) => {
                let (resolved, inner) = self.resolve(target);
                let mut merged = resolved;
                if let (Value::Object(merged), Value::Object(outer)) = (&mut merged, schema) {
                    for (key, value) in outer {
                        if !matches!(key.as_str(), "$ref" | "allOf" | "description") {
                            merged.insert(key.clone(), value.clone());
                        }
                    }
                }
                (merged, own.or(inner))
            }
            None => (schema.clone(), own),
        }
    }

    /// How a value of `schema` is written in the file, when it is a table
    /// of its own (or tables): the steps below its key.
    fn nesting(&self, schema: &Value) -> Option<(Vec<Step>, Value)> {
        let (resolved, _) = self.resolve(schema);
        if is_struct(&resolved) {
            return Some((Vec::new(), resolved));
        }
        if resolved.get("type").is_some_and(|t| t == "array") {
            let items = resolved.get("items")?;
            let (steps, inner) = self.nesting(items)?;
            return Some(([vec![Step::Each], steps].concat(), inner));
        }
        if resolved.get("type").is_some_and(|t| t == "object") {
            let values = resolved.get("additionalProperties").filter(|v| v.is_object())?;
            let (steps, inner) = self.nesting(values)?;
            let name = resolved.get("x-key").and_then(Value::as_str).unwrap_or("name").to_owned();
            return Some(([vec![Step::Name(name)], steps].concat(), inner));
        }
        None
    }

    fn table(
        &self,
        schema: &Value,
        steps: &[Step],
        depth: usize,
        field_doc: Option<String>,
        out: &mut Vec<Section>,
    ) {
        let (resolved, own_doc) = self.resolve(schema);
        let required: Vec<&str> = resolved
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut keys = Vec::new();
        let mut tables = Vec::new();
        let properties = resolved.get("properties").and_then(Value::as_object);
        let mut names: Vec<&String> = properties.map(|p| p.keys().collect()).unwrap_or_default();
        names.sort();
        for name in names {
            let property = &properties.expect("names come from the properties")[name];
            match self.nesting(property) {
                Some((below, _)) => {
                    let mut path = steps.to_vec();
                    path.push(Step::Key(name.clone()));
                    path.extend(below);
                    tables.push((path, property));
                }
                None => keys.push(self.key(name, property, required.contains(&name.as_str()))),
            }
        }
        out.push(Section {
            header: header(steps),
            depth,
            description: field_doc.or(own_doc).map(|doc| without_header(&doc)),
            keys,
        });
        for (path, property) in tables {
            // A list or map of tables is described by its field, else by
            // the table's own description.
            let (_, doc) = self.resolve(property);
            let (_, inner) = self.nesting(property).expect("a table");
            self.table(&inner, &path, depth + 1, doc, out);
        }
    }

    fn key(&self, name: &str, schema: &Value, required: bool) -> Key {
        let (resolved, doc) = self.resolve(schema);
        let mut meaning = doc.unwrap_or_default();
        for (value, what) in self.choices(&resolved) {
            if let Some(what) = what {
                let _ = write!(meaning, "\n- `{}`: {what}", value_text(&value));
            }
        }
        let default_value = resolved.get("default").cloned();
        Key {
            name: name.to_owned(),
            kind: self.kind(&resolved),
            default: default_value.as_ref().map(toml_text),
            required,
            allowed: self.allowed(&resolved),
            meaning: meaning.trim().to_owned(),
            reference: resolved.get("deprecated").is_some_and(|d| d == true),
            default_value,
            example: resolved.get("examples").and_then(|e| e.get(0)).cloned(),
        }
    }

    /// The values an enum allows, each with what it means when said.
    fn choices(&self, schema: &Value) -> Vec<(Value, Option<String>)> {
        let (schema, _) = self.resolve(schema);
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            return values.iter().map(|v| (v.clone(), None)).collect();
        }
        if let Some(value) = schema.get("const") {
            return vec![(value.clone(), description(&schema))];
        }
        let options = schema.get("oneOf").or_else(|| schema.get("anyOf")).and_then(Value::as_array);
        let Some(options) = options else { return Vec::new() };
        let consts: Vec<(Value, Option<String>)> =
            options.iter().flat_map(|option| self.choices(option)).collect();
        if consts.len() == options.len() {
            consts
        } else {
            Vec::new()
        }
    }

    fn kind(&self, schema: &Value) -> String {
        let (schema, _) = self.resolve(schema);
        let choices = self.choices(&schema);
        if !choices.is_empty() {
            let mut kinds: Vec<&str> = choices.iter().map(|(value, _)| json_kind(value)).collect();
            kinds.dedup();
            return kinds.join(" or ");
        }
        if let Some(options) =
            schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array)
        {
            let kinds: Vec<String> = options.iter().map(|option| self.kind(option)).collect();
            return kinds.join(" or ");
        }
        match schema.get("type") {
            Some(Value::String(kind)) => self.one_kind(kind, &schema),
            Some(Value::Array(kinds)) => kinds
                .iter()
                .filter_map(Value::as_str)
                .map(|kind| self.one_kind(kind, &schema))
                .collect::<Vec<_>>()
                .join(" or "),
            _ => "any".to_owned(),
        }
    }

    fn one_kind(&self, kind: &str, schema: &Value) -> String {
        match kind {
            "array" => match schema.get("items") {
                Some(items) => format!("list of {}", plural(&self.kind(items))),
                None => "list".to_owned(),
            },
            "object" => match schema.get("additionalProperties") {
                Some(values @ Value::Object(_)) => {
                    format!("table of {}", plural(&self.kind(values)))
                }
                _ => "table".to_owned(),
            },
            other => other.to_owned(),
        }
    }

    fn allowed(&self, schema: &Value) -> Option<String> {
        let (schema, _) = self.resolve(schema);
        let choices = self.choices(&schema);
        if !choices.is_empty() {
            let values: Vec<String> =
                choices.iter().map(|(value, _)| format!("`{}`", value_text(value))).collect();
            return Some(values.join(", "));
        }
        let mut parts = Vec::new();
        let number = |key: &str| schema.get(key).filter(|v| v.is_number()).map(Value::to_string);
        // Whole numbers with no sign have a minimum of 0 that goes without saying.
        let integer = schema.get("type").is_some_and(|t| t == "integer");
        match (number("minimum"), number("maximum")) {
            (Some(min), Some(max)) => parts.push(format!("{min} to {max}")),
            (Some(min), None) if !(integer && min == "0") => parts.push(format!("at least {min}")),
            (None, Some(max)) => parts.push(format!("at most {max}")),
            _ => {}
        }
        match (number("minLength"), number("maxLength")) {
            (Some(min), Some(max)) => parts.push(format!("{min} to {max} characters")),
            (Some(min), None) if min == "1" => parts.push("not empty".to_owned()),
            (Some(min), None) => parts.push(format!("at least {min} characters")),
            (None, Some(max)) => parts.push(format!("at most {max} characters")),
            _ => {}
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            parts.push(format!("matching `{pattern}`"));
        }
        if let Some(items) = schema.get("items") {
            let one_of = if self.choices(items).is_empty() { "" } else { "one of " };
            if let Some(each) = self.allowed(items) {
                parts.push(format!("each {one_of}{each}"));
            }
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// A description without the table's header it starts with in the schema
/// (`` `[gateway.api]`: where… `` is `Where…` under that header).
fn without_header(doc: &str) -> String {
    let rest = doc
        .strip_prefix("`[")
        .and_then(|rest| rest.split_once("]`: "))
        .filter(|(header, _)| !header.contains('`'))
        .map(|(_, rest)| rest);
    match rest {
        Some(rest) => {
            let mut chars = rest.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect())
                .unwrap_or_default()
        }
        None => doc.to_owned(),
    }
}

/// A table with keys of its own (a struct), not a map of names.
fn is_struct(schema: &Value) -> bool {
    schema.get("properties").is_some_and(|p| p.as_object().is_some_and(|p| !p.is_empty()))
}

fn description(schema: &Value) -> Option<String> {
    schema.get("description").and_then(Value::as_str).filter(|d| !d.is_empty()).map(str::to_owned)
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "table",
        Value::Null => "any",
    }
}

fn plural(kind: &str) -> String {
    kind.split(" or ")
        .map(|kind| match kind {
            "any" => "values".to_owned(),
            kind if kind.starts_with("list of ") || kind.starts_with("table of ") => {
                format!("{kind} each")
            }
            kind => format!("{kind}s"),
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

/// A value as it appears in a list of choices: strings without quotes.
fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => toml_text(other),
    }
}

/// A JSON value written as TOML (`"text"`, `[1, 2]`, `{ a = 1 }`).
pub fn toml_text(value: &Value) -> String {
    match value {
        Value::String(text) => toml::Value::String(text.clone()).to_string(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(toml_text).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) if map.is_empty() => "{}".to_owned(),
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let entries: Vec<String> = keys
                .iter()
                .map(|key| format!("{} = {}", toml_key(key), toml_text(&map[*key])))
                .collect();
            format!("{{ {} }}", entries.join(", "))
        }
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Text for a table cell: no pipe ends the cell, no line ends the row.
fn cell(text: &str) -> String {
    prose(text).replace('|', "\\|").replace("\n\n", "<br><br>").replace('\n', "<br>")
}

/// Text outside code spans with `<` written as an entity, so `<name>` is
/// not taken for an HTML tag.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut code = false;
    for c in text.chars() {
        match c {
            '`' => {
                code = !code;
                out.push(c);
            }
            '<' if !code => out.push_str("&lt;"),
            c => out.push(c),
        }
    }
    out
}

/// Anchors from headers, each unique: `[gateway.api]` is `gateway-api`.
#[derive(Default)]
struct Anchors {
    used: Vec<String>,
}

impl Anchors {
    fn of(&mut self, header: &str) -> String {
        let mut base = String::new();
        for c in header.chars() {
            if c.is_ascii_alphanumeric() {
                base.push(c.to_ascii_lowercase());
            } else if !base.is_empty() && !base.ends_with('-') {
                base.push('-');
            }
        }
        let base = base.trim_end_matches('-').to_owned();
        let mut anchor = base.clone();
        let mut n = 2;
        while self.used.contains(&anchor) {
            anchor = format!("{base}-{n}");
            n += 1;
        }
        self.used.push(anchor.clone());
        anchor
    }
}

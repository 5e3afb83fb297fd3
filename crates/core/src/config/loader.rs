//! Reading `config.toml`: parse, collect unknown keys as warnings, validate, and
//! report every failure with file, line and column.
//!
//! The text is parsed twice: once by `toml_edit` into a document that keeps the
//! byte span of every key and value (used only to turn spans into key paths and
//! positions), and once by serde into [`Config`]. Both use the same parser, so a
//! file that fails one fails the other the same way.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml_edit::{ImDocument, Item, Key, Table, TableLike, Value};

use super::keys::{did_you_mean, field_names, UnknownKey};
use super::Config;
use crate::engine::validate::MAX_MODEL_LEN;
use crate::engine::InvalidValue;
use crate::ids::EngineId;

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl Position {
    /// The position of byte `offset` in `text`, clamped to the text.
    pub(crate) fn of_offset(text: &str, offset: usize) -> Position {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Position {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A config file that could not be used.
///
/// Displays as `<file>:<line>:<column>: <key path>: <message>`, for example
/// `/home/u/.lemon/config.toml:3:23: gateway.max_concurrent_runs: invalid type:
/// string "two", expected a whole number, 0 or more`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read (missing, a directory, no permission…).
    Read { path: PathBuf, message: String },
    /// The text is not valid TOML.
    Syntax { path: PathBuf, at: Position, message: String },
    /// Valid TOML with a wrong type, an unknown enum value or a value that fails
    /// validation. `key` is the dotted path (`gateway.bindings[0].transport`);
    /// `at` points at the value, or at the key when the key itself is wrong.
    Invalid { path: PathBuf, at: Option<Position>, key: String, message: String },
    /// An environment variable that overrides a setting of the file at
    /// `path` has a value that cannot be used.
    Env { path: PathBuf, var: String, message: String },
}

impl ConfigError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ConfigError::Read { path, .. }
            | ConfigError::Syntax { path, .. }
            | ConfigError::Invalid { path, .. }
            | ConfigError::Env { path, .. } => path,
        }
    }

    /// Where in the file, when known.
    pub fn position(&self) -> Option<Position> {
        match self {
            ConfigError::Read { .. } | ConfigError::Env { .. } => None,
            ConfigError::Syntax { at, .. } => Some(*at),
            ConfigError::Invalid { at, .. } => *at,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { path, message } => write!(f, "{}: {message}", path.display()),
            ConfigError::Syntax { path, at, message } => {
                write!(f, "{}:{at}: invalid TOML: {message}", path.display())
            }
            ConfigError::Invalid { path, at, key, message } => {
                write!(f, "{}", path.display())?;
                if let Some(at) = at {
                    write!(f, ":{at}")?;
                }
                if !key.is_empty() {
                    write!(f, ": {key}")?;
                }
                write!(f, ": {message}")
            }
            ConfigError::Env { var, message, .. } => {
                write!(f, "environment variable {var}: {message}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// A loaded config and the warnings found while loading it.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    /// One line each, ready to log:
    /// `<file>:<line>:<column>: unknown key gateway.foo (ignored)`.
    pub warnings: Vec<String>,
}

/// Parses and validates `text`; `path` is only used in messages.
///
/// # Errors
/// [`ConfigError::Syntax`] for invalid TOML, [`ConfigError::Invalid`] for wrong
/// types and values; both name the file, line and column.
pub fn load_str(text: &str, path: &Path) -> Result<LoadedConfig, ConfigError> {
    load(text, path, None)
}

/// As [`load_str`], then the environment variables the reference gateway
/// reads applied over the file ([`super::env`]): what a start, a reload and
/// `config check` use. A variable that replaces a value of the file adds a
/// warning naming both.
///
/// # Errors
/// As [`load_str`]; [`ConfigError::Env`] naming a variable whose value
/// cannot be used.
pub fn load_str_with_env(
    text: &str,
    path: &Path,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<LoadedConfig, ConfigError> {
    load(text, path, Some(env))
}

fn load(
    text: &str,
    path: &Path,
    env: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<LoadedConfig, ConfigError> {
    let doc = ImDocument::parse(text).map_err(|e| ConfigError::Syntax {
        path: path.to_owned(),
        at: Position::of_offset(text, e.span().map_or(0, |s| s.start)),
        message: one_line(e.message()),
    })?;
    let file = ParsedFile { text, path, doc: &doc };

    let mut ignored: Vec<Vec<Segment>> = Vec::new();
    let mut config: Config =
        serde_ignored::deserialize(toml::Deserializer::new(text), |p| ignored.push(segments(&p)))
            .map_err(|e: toml::de::Error| file.deserialize_error(&e))?;

    let suggestion = |segs: &[Segment]| {
        let last = match segs.last() {
            Some(Segment::Key(last)) => Some(last.as_str()),
            _ => None,
        };
        last.and_then(|last| did_you_mean(last, known_keys(segs).iter().copied()))
    };
    // A whole section nobody reads (`[gatway]`) is an error: everything in it
    // would be ignored. A stray key is a warning.
    if let Some(segs) = ignored.iter().find(|segs| file.is_section(segs)) {
        let message = match suggestion(segs) {
            Some(known) => format!("unknown section; did you mean `{known}`?"),
            None => "unknown section".to_owned(),
        };
        return Err(file.invalid(segs, Anchor::Key, message));
    }
    let mut warnings: Vec<String> =
        ignored.iter().map(|segs| file.unknown_key_warning(segs, suggestion(segs))).collect();
    if let Some(env) = env {
        let raw: toml::Table = toml::from_str(text).unwrap_or_default();
        let notes = super::env::apply_env(&mut config, &raw, env).map_err(|e| {
            ConfigError::Env { path: path.to_owned(), var: e.var, message: e.message }
        })?;
        warnings.extend(notes.iter().map(|note| file.note(note)));
    }
    warnings.extend(inert_gateway_keys(&config).iter().map(|note| file.note(note)));
    validate(&config, &file)?;
    Ok(LoadedConfig { config, warnings })
}

/// As [`load_str`] for a text that may set only the `allowed` keys of
/// `[gateway]` (the cluster config): any other key is an error at the key,
/// with the message `refused` gives for it, and so is a key no section
/// knows (a warning in a file). The rest of the config keeps its defaults.
pub(super) fn load_restricted(
    text: &str,
    path: &Path,
    allowed: &[&str],
    refused: impl Fn(&str) -> String,
) -> Result<Config, ConfigError> {
    let doc = ImDocument::parse(text).map_err(|e| ConfigError::Syntax {
        path: path.to_owned(),
        at: Position::of_offset(text, e.span().map_or(0, |s| s.start)),
        message: one_line(e.message()),
    })?;
    let file = ParsedFile { text, path, doc: &doc };
    for (name, item) in doc.as_table().iter() {
        if name != "gateway" {
            let why = "only keys of [gateway] go here".to_owned();
            return Err(file.invalid(&[key(name)], Anchor::Key, why));
        }
        for (inner, _) in item.as_table_like().into_iter().flat_map(TableLike::iter) {
            if !allowed.contains(&inner) {
                let segs = [key("gateway"), key(inner)];
                return Err(file.invalid(&segs, Anchor::Key, refused(inner)));
            }
        }
    }
    let mut ignored: Vec<Vec<Segment>> = Vec::new();
    let config: Config =
        serde_ignored::deserialize(toml::Deserializer::new(text), |p| ignored.push(segments(&p)))
            .map_err(|e: toml::de::Error| file.deserialize_error(&e))?;
    if let Some(segs) = ignored.first() {
        let last = match segs.last() {
            Some(Segment::Key(last)) => Some(last.as_str()),
            _ => None,
        };
        let message =
            match last.and_then(|last| did_you_mean(last, known_keys(segs).iter().copied())) {
                Some(known) => format!("unknown key; did you mean `{known}`?"),
                None => "unknown key".to_owned(),
            };
        return Err(file.invalid(segs, Anchor::Key, message));
    }
    validate(&config, &file)?;
    Ok(config)
}

/// `[gateway]` values of the reference's keys that this gateway reads but
/// cannot honour, each with what happens instead.
fn inert_gateway_keys(config: &Config) -> Vec<super::KeyNote> {
    let mut notes = Vec::new();
    if config.gateway.auto_resume == Some(false) {
        notes.push(super::KeyNote::new(
            &["gateway", "auto_resume"],
            "false is accepted; a conversation here always continues its last engine session \
             (send /new, or meta.disable_auto_resume = true, to start fresh)",
        ));
    }
    notes
}

/// A note about a key a section another crate parses reads (an alias that
/// lost to our own key, a reference key without a use here), placed in the
/// file like [`unknown_key_warning`]: `<file>:<line>:<column>: gateway.sms.webhook_port:
/// <message>`. `section` is the section's path and the note's path is inside it.
pub fn key_note_warning(
    path: &Path,
    text: &str,
    section: &[&str],
    note: &super::KeyNote,
) -> String {
    let full = super::KeyNote {
        path: section.iter().map(|s| (*s).to_owned()).chain(note.path.iter().cloned()).collect(),
        message: note.message.clone(),
    };
    match ImDocument::parse(text) {
        Ok(doc) => ParsedFile { text, path, doc: &doc }.note(&full),
        Err(_) => format!("{}: {}: {}", path.display(), full.path.join("."), full.message),
    }
}

/// The keys the table holding the last key of `segs` knows.
fn known_keys(segs: &[Segment]) -> &'static [&'static str] {
    use super::{
        BindingConfig, GatewayConfig, HttpClientLimitsConfig, ListenConfig, ProjectConfig,
        QueueConfig,
    };
    let keys: Vec<&str> = segs
        .iter()
        .map(|seg| match seg {
            Segment::Key(k) => k.as_str(),
            Segment::Index(_) => "[]",
        })
        .collect();
    match keys.as_slice() {
        [_] => field_names::<Config>(),
        ["gateway", _] => field_names::<GatewayConfig>(),
        ["gateway", "queue", _] => field_names::<QueueConfig>(),
        ["gateway", "http_client_limits", _] => field_names::<HttpClientLimitsConfig>(),
        ["gateway", "files", _] => field_names::<crate::media::FilesConfig>(),
        ["gateway", "api" | "health", _] => field_names::<ListenConfig>(),
        ["gateway", "projects", _, _] => field_names::<ProjectConfig>(),
        ["gateway", "bindings", "[]", _] => field_names::<BindingConfig>(),
        _ => &[],
    }
}

/// A warning for a key a section another crate parses does not know, placed in
/// the file like core's own: `<file>:<line>:<column>: unknown key
/// gateway.webhook.tokn (ignored); did you mean `token`?`. `section` is the
/// section's path and `key` the path inside it.
pub fn unknown_key_warning(path: &Path, text: &str, section: &[&str], key: &UnknownKey) -> String {
    let segs: Vec<Segment> = section
        .iter()
        .map(|name| Segment::Key((*name).to_owned()))
        .chain(key.path.iter().map(|part| match part.parse::<usize>() {
            Ok(index) => Segment::Index(index),
            Err(_) => Segment::Key(part.clone()),
        }))
        .collect();
    match ImDocument::parse(text) {
        Ok(doc) => ParsedFile { text, path, doc: &doc }
            .unknown_key_warning(&segs, key.suggestion.as_deref()),
        Err(_) => {
            let mut out =
                format!("{}: unknown key {} (ignored)", path.display(), format_path(&segs));
            if let Some(suggestion) = &key.suggestion {
                out.push_str(&format!("; did you mean `{suggestion}`?"));
            }
            out
        }
    }
}

/// Reads, parses and validates the file at `path`.
///
/// # Errors
/// [`ConfigError::Read`] naming the path when it cannot be read (including when
/// it does not exist), otherwise as [`load_str`].
pub fn load_file(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| read_error(path, &e))?;
    load_str(&text, path)
}

/// As [`load_file`], then the environment's overrides ([`load_str_with_env`]);
/// a file that does not exist is the defaults with the overrides.
///
/// # Errors
/// As [`load_file`] (a missing file aside) and [`load_str_with_env`].
pub fn load_file_with_env(
    path: &Path,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<LoadedConfig, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => load_str_with_env(&text, path, env),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => load_str_with_env("", path, env),
        Err(e) => Err(read_error(path, &e)),
    }
}

/// As [`load_file`], but a file that does not exist yields the defaults and no
/// warnings: a fresh install has no config file.
///
/// # Errors
/// As [`load_file`], except for a missing file.
pub fn load_file_or_default(path: &Path) -> Result<LoadedConfig, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&text, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(LoadedConfig { config: Config::default(), warnings: Vec::new() })
        }
        Err(e) => Err(read_error(path, &e)),
    }
}

fn read_error(path: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError::Read { path: path.to_owned(), message: format!("cannot read config file: {e}") }
}

/// An error about a section another crate parses (`[gateway.telegram]`, say),
/// placed in the file: at the first key quoted in `message` (`like_this`) that
/// the section has (the key itself for an unknown field, else its value), or at
/// the section's header.
pub fn section_error(path: &Path, text: &str, section: &[&str], message: &str) -> ConfigError {
    let message = one_line(message);
    let Ok(doc) = ImDocument::parse(text) else {
        return ConfigError::Invalid {
            path: path.to_owned(),
            at: None,
            key: section.join("."),
            message,
        };
    };
    let file = ParsedFile { text, path, doc: &doc };
    // A part of digits names an entry of an array of tables (`bindings`, `0`).
    let mut segs: Vec<Segment> = Vec::new();
    let mut table = Some(file.root());
    for name in section {
        let seg = match (table, name.parse::<usize>()) {
            (Some(node), Ok(index)) if node.child(&key(name)).is_none() => Segment::Index(index),
            _ => key(name),
        };
        table = table.and_then(|node| Some(node.child(&seg)?.1));
        segs.push(seg);
    }
    // A quoted `a.b.c` names a key in a nested table of the section.
    let mut quoted = message.split('`').skip(1).step_by(2);
    let found = table.and_then(|table| {
        quoted.find_map(|q| {
            let parts: Vec<Segment> = q.split('.').map(key).collect();
            let mut node = table;
            for part in &parts {
                node = node.child(part)?.1;
            }
            Some(parts)
        })
    });
    if let Some(parts) = found {
        segs.extend(parts);
    }
    let anchor = if message.contains("unknown field") { Anchor::Key } else { Anchor::Value };
    file.invalid(&segs, anchor, message)
}

/// TOML parser messages span several lines ("invalid string\nexpected …"),
/// and name Rust's types; one line, in words ([`plain_types`]).
fn one_line(message: &str) -> String {
    let line =
        message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
    plain_types(&line)
}

/// `expected usize` as a person reads it: `expected a whole number, 0 or more`.
fn plain_types(message: &str) -> String {
    const TYPES: [(&str, &str); 11] = [
        ("usize", "a whole number, 0 or more"),
        ("u64", "a whole number, 0 or more"),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u16", "a whole number from 0 to 65535"),
        ("u8", "a whole number from 0 to 255"),
        ("isize", "a whole number"),
        ("i64", "a whole number"),
        ("i32", "a whole number"),
        ("i16", "a whole number"),
        ("f64", "a number"),
        ("f32", "a number"),
    ];
    let mut out = message.to_owned();
    for (rust, words) in TYPES {
        let needle = format!("expected {rust}");
        let mut from = 0;
        while let Some(found) = out[from..].find(&needle) {
            let (start, end) = (from + found, from + found + needle.len());
            let whole_word = !out[end..].starts_with(|c: char| c.is_ascii_alphanumeric());
            if whole_word {
                let plain = format!("expected {words}");
                out.replace_range(start..end, &plain);
                from = start + plain.len();
            } else {
                from = end;
            }
        }
    }
    out
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// `gateway.bindings[0].transport`; keys that are not bare TOML keys are quoted.
fn format_path(segs: &[Segment]) -> String {
    let mut out = String::new();
    for seg in segs {
        match seg {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                let bare = !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if bare {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("{k:?}"));
                }
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn segments(path: &serde_ignored::Path<'_>) -> Vec<Segment> {
    let mut out = Vec::new();
    collect_segments(path, &mut out);
    out
}

fn collect_segments(path: &serde_ignored::Path<'_>, out: &mut Vec<Segment>) {
    use serde_ignored::Path as P;
    match path {
        P::Root => {}
        P::Seq { parent, index } => {
            collect_segments(parent, out);
            out.push(Segment::Index(*index));
        }
        P::Map { parent, key } => {
            collect_segments(parent, out);
            out.push(Segment::Key(key.clone()));
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            collect_segments(parent, out);
        }
    }
}

/// A node of the spanned document: tables, arrays of tables and values are
/// different types in `toml_edit`.
#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Table(&'a Table),
    Value(&'a Value),
}

impl<'a> Node<'a> {
    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Item(i) => i.span(),
            Node::Table(t) => t.span(),
            Node::Value(v) => v.span(),
        }
    }

    fn table_like(self) -> Option<&'a dyn TableLike> {
        match self {
            Node::Item(i) => i.as_table_like(),
            Node::Table(t) => Some(t),
            Node::Value(Value::InlineTable(t)) => Some(t),
            Node::Value(_) => None,
        }
    }

    fn children(self) -> Vec<(Segment, Option<&'a Key>, Node<'a>)> {
        if let Some(table) = self.table_like() {
            return table
                .iter()
                .map(|(k, item)| {
                    let key = table.get_key_value(k).map(|(key, _)| key);
                    (Segment::Key(k.to_owned()), key, Node::Item(item))
                })
                .collect();
        }
        match self {
            Node::Item(Item::ArrayOfTables(a)) => a
                .iter()
                .enumerate()
                .map(|(i, t)| (Segment::Index(i), None, Node::Table(t)))
                .collect(),
            Node::Item(Item::Value(Value::Array(a))) | Node::Value(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| (Segment::Index(i), None, Node::Value(v)))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn child(self, seg: &Segment) -> Option<(Option<&'a Key>, Node<'a>)> {
        match seg {
            Segment::Key(k) => {
                let (key, item) = self.table_like()?.get_key_value(k)?;
                Some((Some(key), Node::Item(item)))
            }
            Segment::Index(i) => match self {
                Node::Item(Item::ArrayOfTables(a)) => Some((None, Node::Table(a.get(*i)?))),
                Node::Item(Item::Value(Value::Array(a))) | Node::Value(Value::Array(a)) => {
                    Some((None, Node::Value(a.get(*i)?)))
                }
                _ => None,
            },
        }
    }
}

fn contains(span: Option<Range<usize>>, offset: usize) -> bool {
    span.is_some_and(|s| s.contains(&offset) || (s.is_empty() && s.start == offset))
}

/// The deepest key path whose key or value covers byte `offset`.
fn path_at(node: Node<'_>, offset: usize) -> Option<Vec<Segment>> {
    for (seg, key, child) in node.children() {
        if contains(key.and_then(Key::span), offset) {
            return Some(vec![seg]);
        }
        if let Some(mut rest) = path_at(child, offset) {
            rest.insert(0, seg);
            return Some(rest);
        }
        if contains(child.span(), offset) {
            return Some(vec![seg]);
        }
    }
    None
}

/// Which end of a `key = value` pair an error points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Anchor {
    Key,
    Value,
}

/// The text being loaded, with its spanned document, for building messages.
struct ParsedFile<'a> {
    text: &'a str,
    path: &'a Path,
    doc: &'a ImDocument<&'a str>,
}

impl ParsedFile<'_> {
    fn root(&self) -> Node<'_> {
        Node::Table(self.doc.as_table())
    }

    /// The span of the key or value at `segs`, falling back to the other one.
    fn span_of(&self, segs: &[Segment], anchor: Anchor) -> Option<Range<usize>> {
        let mut node = self.root();
        let mut key = None;
        for seg in segs {
            let (k, child) = node.child(seg)?;
            key = k;
            node = child;
        }
        let key_span = key.and_then(Key::span);
        match anchor {
            Anchor::Key => key_span.or_else(|| node.span()),
            Anchor::Value => node.span().or(key_span),
        }
    }

    fn position_of(&self, segs: &[Segment], anchor: Anchor) -> Option<Position> {
        self.span_of(segs, anchor).map(|s| Position::of_offset(self.text, s.start))
    }

    fn deserialize_error(&self, e: &toml::de::Error) -> ConfigError {
        let span = e.span();
        let key = span.as_ref().and_then(|s| path_at(self.root(), s.start)).unwrap_or_default();
        ConfigError::Invalid {
            path: self.path.to_owned(),
            at: span.map(|s| Position::of_offset(self.text, s.start)),
            key: format_path(&key),
            message: one_line(e.message()),
        }
    }

    fn invalid(&self, segs: &[Segment], anchor: Anchor, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            at: self.position_of(segs, anchor),
            key: format_path(segs),
            message,
        }
    }

    /// Whether `segs` names a table written as a header (`[gatway]`,
    /// `[[gateway.crn]]`), not a key or an inline table.
    fn is_section(&self, segs: &[Segment]) -> bool {
        let mut node = self.root();
        for seg in segs {
            match node.child(seg) {
                Some((_, child)) => node = child,
                None => return false,
            }
        }
        matches!(node, Node::Item(Item::Table(_) | Item::ArrayOfTables(_)))
    }

    /// `<file>:<line>:<column>: <key path>: <message>`, placed at the key, or
    /// at the closest table above it the file has.
    fn note(&self, note: &super::KeyNote) -> String {
        let segs: Vec<Segment> = note.path.iter().map(|part| key(part)).collect();
        let mut out = self.path.display().to_string();
        let at = (1..=segs.len()).rev().find_map(|n| self.position_of(&segs[..n], Anchor::Key));
        if let Some(at) = at {
            out.push_str(&format!(":{at}"));
        }
        out.push_str(&format!(": {}: {}", format_path(&segs), note.message));
        out
    }

    fn unknown_key_warning(&self, segs: &[Segment], suggestion: Option<&str>) -> String {
        let mut out = self.path.display().to_string();
        if let Some(at) = self.position_of(segs, Anchor::Key) {
            out.push_str(&format!(":{at}"));
        }
        out.push_str(&format!(": unknown key {} (ignored)", format_path(segs)));
        if let Some(suggestion) = suggestion {
            out.push_str(&format!("; did you mean `{suggestion}`?"));
        }
        out
    }
}

fn key(k: &str) -> Segment {
    Segment::Key(k.to_owned())
}

/// Checks serde cannot express. The first failure in a fixed order (engines,
/// projects, bindings, queue, HTTP limits) is returned.
fn validate(config: &Config, file: &ParsedFile<'_>) -> Result<(), ConfigError> {
    let gateway = &config.gateway;
    let at =
        |segs: &[Segment], anchor: Anchor, message: String| file.invalid(segs, anchor, message);

    // The sections' own keys are the engines' to check (`lemon_engines::config`);
    // their ids are names the router resolves, so they are checked here.
    for id in gateway.engines.keys() {
        EngineId::parse(id).map_err(|e| {
            at(&[key("gateway"), key("engines"), key(id)], Anchor::Key, e.to_string())
        })?;
    }

    for (id, project) in &gateway.projects {
        let segs = [key("gateway"), key("projects"), key(id)];
        if project.root.as_os_str().is_empty() {
            let segs = [segs.as_slice(), &[key("root")]].concat();
            return Err(at(&segs, Anchor::Value, "must not be empty".to_owned()));
        }
    }

    for (i, binding) in gateway.bindings.iter().enumerate() {
        let segs = [key("gateway"), key("bindings"), Segment::Index(i)];
        if binding.transport.trim().is_empty() {
            let segs = [segs.as_slice(), &[key("transport")]].concat();
            return Err(at(&segs, Anchor::Value, "must not be empty".to_owned()));
        }
    }
    let tool_lists = gateway
        .projects
        .iter()
        .map(|(id, project)| (vec![key("gateway"), key("projects"), key(id)], &project.tools))
        .chain(gateway.bindings.iter().enumerate().map(|(i, binding)| {
            (vec![key("gateway"), key("bindings"), Segment::Index(i)], &binding.tools)
        }));
    for (segs, tools) in tool_lists {
        if let Some(Err(why)) = tools.as_deref().map(crate::mcp::check_patterns) {
            let segs = [segs.as_slice(), &[key("tools")]].concat();
            return Err(at(&segs, Anchor::Value, why));
        }
    }
    for (i, server) in gateway.mcp_servers.iter().enumerate() {
        let segs =
            |name: &str| vec![key("gateway"), key("mcp_servers"), Segment::Index(i), key(name)];
        server.check().map_err(|(name, why)| at(&segs(name), Anchor::Value, why))?;
        if gateway.mcp_servers[..i].iter().any(|other| other.name == server.name) {
            let why = format!("another server is already named {:?}", server.name);
            return Err(at(&segs("name"), Anchor::Value, why));
        }
    }

    check_cron(&gateway.cron).map_err(|(segs, message)| at(&segs, Anchor::Value, message))?;
    if let Some(backup) = &gateway.backup {
        let segs = |name: &str| [key("gateway"), key("backup"), key(name)];
        if let Err(err) = crate::cron::Schedule::parse(&backup.every) {
            return Err(at(&segs("every"), Anchor::Value, err.to_string()));
        }
        if backup.keep == 0 {
            return Err(at(&segs("keep"), Anchor::Value, "must be at least 1".to_owned()));
        }
        if let Some(Err(err)) = backup.timezone.as_deref().map(crate::cron::parse_timezone) {
            return Err(at(&segs("timezone"), Anchor::Value, err.to_string()));
        }
    }

    if let Some(problem) = gateway.files.check().into_iter().next() {
        let (name, why) = problem.split_once(": ").unwrap_or(("", problem.as_str()));
        let segs = [key("gateway"), key("files"), key(name)];
        return Err(at(&segs, Anchor::Value, why.to_owned()));
    }

    let store = &gateway.store;
    let store_key = |name: &str| [key("gateway"), key("store"), key(name)];
    if store.pool_size == 0 || store.pool_size > 1000 {
        let why = "must be from 1 to 1000".to_owned();
        return Err(at(&store_key("pool_size"), Anchor::Value, why));
    }
    if let Some(Err(_)) = store.url_secret.as_deref().map(crate::secrets::check_name) {
        let why = "not a secret name (letters, digits, `_`, `-`, `.`; at most 128)".to_owned();
        return Err(at(&store_key("url_secret"), Anchor::Value, why));
    }
    if store.backend == crate::config::StoreBackendKind::Postgres && store.url_secret.is_none() {
        let why = "backend = \"postgres\" needs url_secret: the secret that holds the \
                   connection string"
            .to_owned();
        return Err(at(&store_key("backend"), Anchor::Value, why));
    }

    let cluster = &gateway.cluster;
    let cluster_key = |name: &str| [key("gateway"), key("cluster"), key(name)];
    if let Some(Err(why)) = cluster.node_id.as_deref().map(crate::cluster::NodeId::parse) {
        return Err(at(&cluster_key("node_id"), Anchor::Value, why.to_string()));
    }
    let terms = crate::config::ClusterConfig::MIN_LEASE_TERM_MS
        ..=crate::config::ClusterConfig::MAX_LEASE_TERM_MS;
    if !terms.contains(&cluster.lease_term_ms) {
        let why = format!("must be from {} to {}", terms.start(), terms.end());
        return Err(at(&cluster_key("lease_term_ms"), Anchor::Value, why));
    }
    if let Some(url) = &cluster.api_base_url {
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if rest.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
            let why = format!("{url:?} is not an http:// or https:// URL");
            return Err(at(&cluster_key("api_base_url"), Anchor::Value, why));
        }
    }
    if cluster.enabled && store.backend != crate::config::StoreBackendKind::Postgres {
        let why = format!(
            "cluster mode needs the postgres store ([gateway.store] backend = \"postgres\"); \
             the store is {}",
            store.backend.as_str()
        );
        return Err(at(&cluster_key("enabled"), Anchor::Value, why));
    }

    if gateway.retention.max_db_mb == Some(0) {
        let segs = [key("gateway"), key("retention"), key("max_db_mb")];
        return Err(at(&segs, Anchor::Value, "must be at least 1 (or unset: no bound)".to_owned()));
    }

    let approvals = &gateway.approvals;
    let compiled = crate::approvals::Policy::from_config(approvals).map_err(|e| ("rules", e));
    let compiled = compiled.and_then(|_| {
        crate::approvals::Policy::untrusted_from_config(approvals).map_err(|e| ("untrusted", e))
    });
    if let Err((list, (i, name, why))) = compiled {
        let segs = [key("gateway"), key("approvals"), key(list), Segment::Index(i), key(name)];
        return Err(at(&segs, Anchor::Value, format!("not a glob: {why}")));
    }
    // The rules of engines, projects and bindings: each list by where it is.
    let mut scoped: Vec<(Vec<Segment>, &[crate::config::ApprovalRuleConfig])> = Vec::new();
    for (id, rules) in &approvals.engines {
        scoped.push((vec![key("gateway"), key("approvals"), key("engines"), key(id)], rules));
    }
    for (id, project) in &gateway.projects {
        scoped.push((
            vec![key("gateway"), key("projects"), key(id), key("approvals")],
            &project.approvals,
        ));
    }
    for (i, binding) in gateway.bindings.iter().enumerate() {
        let segs = vec![key("gateway"), key("bindings"), Segment::Index(i), key("approvals")];
        scoped.push((segs, &binding.approvals));
    }
    for (segs, rules) in scoped {
        if let Err((i, name, why)) = crate::approvals::Policy::compile(rules, 1, "") {
            let segs = [segs.as_slice(), &[Segment::Index(i), key(name)]].concat();
            return Err(at(&segs, Anchor::Value, format!("not a glob: {why}")));
        }
    }
    if gateway.approvals.timeout_ms == 0 {
        let segs = [key("gateway"), key("approvals"), key("timeout_ms")];
        return Err(at(&segs, Anchor::Value, "must be at least 1".to_owned()));
    }

    for (i, root) in gateway.allowed_cwd_roots.iter().enumerate() {
        if !root.is_absolute() {
            let segs = [key("gateway"), key("allowed_cwd_roots"), Segment::Index(i)];
            let message = format!("{} is not an absolute path", root.display());
            return Err(at(&segs, Anchor::Value, message));
        }
    }

    let budgets = &gateway.budgets;
    let negative = "must be a number of at least 0".to_owned();
    let global_usd = [
        ("run_usd", budgets.run_usd),
        ("session_daily_usd", budgets.session_daily_usd),
        ("daily_usd", budgets.daily_usd),
    ];
    if let Some((name, _)) =
        global_usd.iter().find(|(_, usd)| usd.is_some_and(|usd| !usd.is_finite() || usd < 0.0))
    {
        let segs = [key("gateway"), key("budgets"), key(name)];
        return Err(at(&segs, Anchor::Value, negative));
    }
    for (model, price) in &budgets.prices {
        if let Some(name) = price.invalid_key() {
            let segs = [key("gateway"), key("budgets"), key("prices"), key(model), key(name)];
            return Err(at(&segs, Anchor::Value, negative));
        }
    }
    for (i, binding) in gateway.bindings.iter().enumerate() {
        if let Some(name) = binding.budget.as_ref().and_then(|b| b.invalid_key()) {
            let segs =
                [key("gateway"), key("bindings"), Segment::Index(i), key("budget"), key(name)];
            return Err(at(&segs, Anchor::Value, negative));
        }
    }

    if gateway.queue.cap == Some(0) {
        let segs = [key("gateway"), key("queue"), key("cap")];
        return Err(at(&segs, Anchor::Value, "must be at least 1".to_owned()));
    }
    let http_keys = [
        ("http_header_read_timeout_ms", gateway.http_header_read_timeout_ms == 0),
        ("http_idle_timeout_ms", gateway.http_idle_timeout_ms == 0),
        ("http_max_connections", gateway.http_max_connections == Some(0)),
        ("worker_threads", gateway.worker_threads == Some(0)),
    ];
    if let Some((name, _)) = http_keys.iter().find(|(_, zero)| *zero) {
        let segs = [key("gateway"), key(name)];
        return Err(at(&segs, Anchor::Value, "must be at least 1".to_owned()));
    }
    check_client_limits(&gateway.http_client_limits)
        .map_err(|(segs, message)| at(&segs, Anchor::Value, message))?;
    check_ranges(config).map_err(|(segs, message)| at(&segs, Anchor::Value, message))
}

/// `[gateway.http_client_limits]`: the key path and the message of the first
/// bad value.
fn check_client_limits(
    limits: &crate::config::HttpClientLimitsConfig,
) -> Result<(), (Vec<Segment>, String)> {
    let at = |name: &str| vec![key("gateway"), key("http_client_limits"), key(name)];
    if limits.burst == Some(0) && limits.requests_per_second > 0 {
        return Err((
            at("burst"),
            "must be at least 1 while requests_per_second is set".to_owned(),
        ));
    }
    if limits.requests_per_second > MAX_CLIENT_RATE {
        let message = format!("must be at most {MAX_CLIENT_RATE}");
        return Err((at("requests_per_second"), message));
    }
    if limits.burst.is_some_and(|burst| burst > MAX_CLIENT_RATE) {
        return Err((at("burst"), format!("must be at most {MAX_CLIENT_RATE}")));
    }
    if u64::try_from(limits.max_connections).unwrap_or(u64::MAX) > MAX_CONNECTIONS {
        return Err((at("max_connections"), format!("must be at most {MAX_CONNECTIONS}")));
    }
    for (i, text) in limits.exempt.iter().enumerate() {
        if let Err(message) = crate::net::Network::parse(text) {
            let mut segs = at("exempt");
            segs.push(Segment::Index(i));
            return Err((segs, message));
        }
    }
    Ok(())
}

/// `[[gateway.cron]]`: the key path and the message of the first bad value.
fn check_cron(jobs: &[crate::config::CronJobConfig]) -> Result<(), (Vec<Segment>, String)> {
    use crate::cron::{parse_timezone, Schedule, MAX_DURATION_MS, MAX_JITTER_SEC, MAX_RETRIES};
    for (i, job) in jobs.iter().enumerate() {
        let at = |name: &str| vec![key("gateway"), key("cron"), Segment::Index(i), key(name)];
        let name = job.name.trim();
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err((at("name"), "must be a name without control characters".to_owned()));
        }
        if jobs[..i].iter().any(|other| other.name.trim() == name) {
            return Err((at("name"), format!("another job is already named {name:?}")));
        }
        if let Err(e) = Schedule::parse(&job.schedule) {
            return Err((at("schedule"), format!("invalid schedule {:?}: {e}", job.schedule)));
        }
        if job.prompt.trim().is_empty() {
            return Err((at("prompt"), "must not be empty".to_owned()));
        }
        if let Some(key_text) = &job.session_key {
            if key_text.trim().is_empty() {
                return Err((at("session_key"), "must not be empty".to_owned()));
            }
            if let Err(e) = crate::ids::SessionKey::parse(key_text) {
                return Err((at("session_key"), e.to_string()));
            }
        }
        if let Some(tz) = &job.timezone {
            parse_timezone(tz).map_err(|e| (at("timezone"), e.to_string()))?;
        }
        if job.jitter_sec.is_some_and(|v| v > MAX_JITTER_SEC) {
            return Err((at("jitter_sec"), format!("must be at most {MAX_JITTER_SEC}")));
        }
        if job.timeout_ms.is_some_and(|v| v == 0 || v > MAX_DURATION_MS) {
            return Err((at("timeout_ms"), format!("must be 1 to {MAX_DURATION_MS}")));
        }
        if job.max_retries.is_some_and(|v| v > MAX_RETRIES) {
            return Err((at("max_retries"), format!("must be at most {MAX_RETRIES}")));
        }
        if job.retry_backoff_ms.is_some_and(|v| v > MAX_DURATION_MS) {
            return Err((at("retry_backoff_ms"), format!("must be at most {MAX_DURATION_MS}")));
        }
    }
    Ok(())
}

/// The largest count of concurrent runs, pending runs or queued requests
/// per conversation, and the longest timeouts, that the file may ask for:
/// far beyond any real setup, short of values that are typos.
pub const MAX_CONCURRENT_RUNS: u64 = 4096;
/// See [`MAX_CONCURRENT_RUNS`].
pub const MAX_PENDING_RUNS: u64 = 100_000_000;
/// See [`MAX_CONCURRENT_RUNS`].
pub const MAX_QUEUE_CAP: u64 = 1_000_000;
/// See [`MAX_CONCURRENT_RUNS`]: 30 days, in milliseconds.
pub const MAX_DURATION_MS: u64 = 30 * 24 * 60 * 60 * 1000;
/// See [`MAX_CONCURRENT_RUNS`].
pub const MAX_CONNECTIONS: u64 = 10_000_000;
/// See [`MAX_CONCURRENT_RUNS`]: threads of the async runtime.
pub const MAX_WORKER_THREADS: u64 = 1024;
/// See [`MAX_CONCURRENT_RUNS`]: requests a second (and burst) of one client.
pub const MAX_CLIENT_RATE: u32 = 1_000_000;

/// Counts and durations above their bounds: the key path and the message.
fn check_ranges(config: &Config) -> Result<(), (Vec<Segment>, String)> {
    let gateway = &config.gateway;
    let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let mut checks: Vec<(Vec<Segment>, Option<u64>, u64)> = vec![
        (
            vec![key("max_concurrent_runs")],
            Some(as_u64(gateway.max_concurrent_runs)),
            MAX_CONCURRENT_RUNS,
        ),
        (vec![key("max_pending_runs")], Some(as_u64(gateway.max_pending_runs)), MAX_PENDING_RUNS),
        (vec![key("queue"), key("cap")], gateway.queue.cap.map(as_u64), MAX_QUEUE_CAP),
        (
            vec![key("http_max_connections")],
            gateway.http_max_connections.map(as_u64),
            MAX_CONNECTIONS,
        ),
        (vec![key("worker_threads")], gateway.worker_threads.map(as_u64), MAX_WORKER_THREADS),
    ];
    let durations = [
        ("engine_lock_timeout_ms", Some(gateway.engine_lock_timeout_ms)),
        ("run_inactivity_timeout_ms", Some(gateway.run_inactivity_timeout_ms)),
        ("run_idle_watchdog_ms", gateway.run_idle_watchdog_ms),
        ("shutdown_grace_ms", Some(gateway.shutdown_grace_ms)),
        ("recovered_max_age_ms", Some(gateway.recovered_max_age_ms)),
        ("http_header_read_timeout_ms", Some(gateway.http_header_read_timeout_ms)),
        ("http_idle_timeout_ms", Some(gateway.http_idle_timeout_ms)),
    ];
    for (name, value) in durations {
        checks.push((vec![key(name)], value, MAX_DURATION_MS));
    }
    for (segs, value, max) in checks {
        if let Some(value) = value.filter(|v| *v > max) {
            let segs = [vec![key("gateway")], segs].concat();
            return Err((segs, format!("{value} is too large: must be at most {max}")));
        }
    }
    Ok(())
}

/// Why a model name was refused, as a config error says it (here and in the
/// engines' own sections).
pub fn invalid_model_message(why: InvalidValue) -> String {
    format!(
        "invalid model: {why}; use up to {MAX_MODEL_LEN} ASCII letters, digits and `._:/@-`, not starting with `-`"
    )
}

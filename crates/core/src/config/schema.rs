//! The JSON Schema of `config.toml`, printed from the config types themselves:
//! their doc comments are the keys' descriptions, their serde attributes and
//! default functions the keys' names and default values, and their
//! `#[schemars(…)]` attributes the bounds the loader checks.
//!
//! The sections another crate parses (`[gateway.telegram]`,
//! `[gateway.engines.<id>]`…) are raw tables here; their place in the schema
//! is marked, and [`document`] fills each with the schema of the type that
//! crate parses it into ([`SectionSchema`]), checking that none is left out.
//! The reference page ([`markdown`]) and the starter file ([`starter`]) are
//! printed from the finished document, so the three cannot disagree.
//!
//! The document follows JSON Schema draft 7 (what TOML editors' language
//! servers read). TOML has no null, so an unset key is simply absent: the
//! schema never allows `null`. Where the loader reports a key it does not
//! know, the schema says `additionalProperties: false`; where it keeps any
//! key (an engine's own keys, `[gateway.dashboard]`), it allows them.

pub mod markdown;
pub mod starter;

use std::collections::BTreeMap;

use schemars::generate::SchemaSettings;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value};

use super::{Config, ReferenceKey};
use crate::ids::EngineRef;

/// A section of `[gateway]` that another crate parses, and how to get its
/// schema: from the generator of the whole document, so the types it uses
/// join the document's definitions.
#[derive(Debug, Clone, Copy)]
pub struct SectionSchema {
    /// The section's key under `[gateway]` (`telegram`, `engines`).
    pub key: &'static str,
    pub schema: fn(&mut SchemaGenerator) -> Schema,
}

impl SectionSchema {
    /// The section `key`, parsed into a `T`.
    pub fn of<T: JsonSchema>(key: &'static str) -> Self {
        SectionSchema { key, schema: SchemaGenerator::subschema_for::<T> }
    }
}

/// Why the document could not be put together: the sections given do not
/// match the sections core leaves to other crates.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("no schema was given for [gateway.{0}]")]
    Missing(&'static str),
    #[error("[gateway.{0}] is not a section another crate parses")]
    Unknown(&'static str),
    #[error("two schemas were given for [gateway.{0}]")]
    Twice(&'static str),
}

/// The key of the mark left where a section another crate parses goes.
const SLOT: &str = "x-lemon-section";

/// The marks of the sections other crates parse, one per field of
/// `GatewayConfig` kept raw, and the list of their keys.
macro_rules! owned_sections {
    ($($key:ident),* $(,)?) => {
        /// The sections of `[gateway]` another crate parses, whose schemas
        /// [`document`] needs.
        pub const OWNED_SECTIONS: &[&str] = &[$(stringify!($key)),*];

        /// Marks for `#[schemars(schema_with = …)]`.
        pub(crate) mod slot {
            $(
                pub(crate) fn $key(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                    super::slot_mark(stringify!($key))
                }
            )*
        }
    };
}

owned_sections!(engines, telegram, discord, xmtp, email, webhook, sms, voice);

fn slot_mark(key: &str) -> Schema {
    json_schema!({ SLOT: key })
}

/// The schema of `config.toml`, with each of [`OWNED_SECTIONS`] filled from
/// `sections`.
///
/// # Errors
/// A section of [`OWNED_SECTIONS`] that `sections` leaves out, gives twice,
/// or a key of `sections` that is not one of them.
pub fn document(sections: &[SectionSchema]) -> Result<Value, SchemaError> {
    for (i, section) in sections.iter().enumerate() {
        if !OWNED_SECTIONS.contains(&section.key) {
            return Err(SchemaError::Unknown(section.key));
        }
        if sections[..i].iter().any(|other| other.key == section.key) {
            return Err(SchemaError::Twice(section.key));
        }
    }
    if let Some(missing) =
        OWNED_SECTIONS.iter().find(|key| !sections.iter().any(|s| s.key == **key))
    {
        return Err(SchemaError::Missing(missing));
    }
    let mut generator = SchemaSettings::draft07().into_generator();
    let filled: BTreeMap<&str, Value> = sections
        .iter()
        .map(|section| (section.key, (section.schema)(&mut generator).to_value()))
        .collect();
    let mut root = generator.root_schema_for::<Config>().to_value();
    fill_slots(&mut root, &filled);
    tidy(&mut root);
    Ok(root)
}

/// `schema` as the JSON printed and checked in: pretty, the keys of every
/// object sorted (whatever order the JSON library keeps), a final newline.
pub fn to_json(schema: &Value) -> String {
    let mut out = serde_json::to_string_pretty(&Sorted(schema)).unwrap_or_default();
    out.push('\n');
    out
}

/// A JSON value serialised with every object's keys in sorted order.
struct Sorted<'a>(&'a Value);

impl serde::Serialize for Sorted<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let mut out = serializer.serialize_map(Some(keys.len()))?;
                for key in keys {
                    out.serialize_entry(key, &Sorted(&map[key]))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Sorted(item))?;
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// Replaces every mark with its section's schema.
fn fill_slots(value: &mut Value, filled: &BTreeMap<&str, Value>) {
    match value {
        Value::Object(map) => {
            if let Some(schema) = map.get(SLOT).and_then(Value::as_str).and_then(|k| filled.get(k))
            {
                *value = schema.clone();
                return;
            }
            map.values_mut().for_each(|inner| fill_slots(inner, filled));
        }
        Value::Array(items) => items.iter_mut().for_each(|inner| fill_slots(inner, filled)),
        _ => {}
    }
}

/// The keywords whose value is one schema, a list of schemas, or a map of
/// schemas by name: the places [`for_each_subschema`] looks.
const ONE: [&str; 6] = ["items", "additionalProperties", "not", "if", "then", "else"];
const LIST: [&str; 3] = ["allOf", "anyOf", "oneOf"];
const NAMED: [&str; 3] = ["properties", "definitions", "patternProperties"];

/// Calls `f` on every schema directly inside `schema` (not on data such as
/// `default` or `enum`, which may look like schemas).
pub fn for_each_subschema(schema: &Value, mut f: impl FnMut(&Value)) {
    let Value::Object(map) = schema else { return };
    for (key, inner) in map {
        match (key.as_str(), inner) {
            (k, Value::Array(items)) if LIST.contains(&k) || k == "items" => {
                items.iter().for_each(&mut f);
            }
            (k, Value::Object(named)) if NAMED.contains(&k) => named.values().for_each(&mut f),
            (k, inner) if ONE.contains(&k) => f(inner),
            _ => {}
        }
    }
}

fn for_each_subschema_mut(schema: &mut Value, mut f: impl FnMut(&mut Value)) {
    let Value::Object(map) = schema else { return };
    for (key, inner) in map.iter_mut() {
        match (key.as_str(), inner) {
            (k, Value::Array(items)) if LIST.contains(&k) || k == "items" => {
                items.iter_mut().for_each(&mut f);
            }
            (k, Value::Object(named)) if NAMED.contains(&k) => {
                named.values_mut().for_each(&mut f);
            }
            (k, inner) if ONE.contains(&k) => f(inner),
            _ => {}
        }
    }
}

/// The formats schemars gives Rust's number types, which no editor knows.
const RUST_FORMATS: [&str; 14] = [
    "int", "int8", "int16", "int32", "int64", "int128", "uint", "uint8", "uint16", "uint32",
    "uint64", "uint128", "float", "double",
];

/// The document as TOML sees it: no `null` anywhere (a key is set or absent),
/// an object's unknown keys refused unless it says otherwise, descriptions as
/// paragraphs rather than source lines, no formats made for Rust's types.
fn tidy(schema: &mut Value) {
    for_each_subschema_mut(schema, tidy);
    let Value::Object(map) = schema else { return };
    if let Some(Value::Array(types)) = map.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            map.insert("type".to_owned(), only);
        }
    }
    if let Some(Value::Array(values)) = map.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    // A table's default is given key by key, in its own schema.
    if map.get("default").is_some_and(|d| d.is_null() || d.is_object()) {
        map.remove("default");
    }
    if map.get("format").and_then(Value::as_str).is_some_and(|f| RUST_FORMATS.contains(&f)) {
        map.remove("format");
    }
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(options)) = map.get_mut(key) else { continue };
        options.retain(|option| !is_null_schema(option));
        if options.len() == 1 {
            let Some(Value::Object(only)) = options.pop() else { continue };
            map.remove(key);
            merge_single(map, only);
        }
    }
    if map.contains_key("properties") && !map.contains_key("additionalProperties") {
        map.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    if let Some(Value::String(text)) = map.get_mut("description") {
        *text = unwrap_lines(text);
    }
}

fn is_null_schema(schema: &Value) -> bool {
    schema.get("type").is_some_and(|t| t == "null")
        || schema.get("const").is_some_and(Value::is_null)
}

/// `map` with the one option left of an `anyOf` put in its place: a `$ref`
/// stays alone in an `allOf` when `map` says more (draft 7 ignores the
/// siblings of a `$ref`).
fn merge_single(map: &mut Map<String, Value>, only: Map<String, Value>) {
    if only.contains_key("$ref") && !map.is_empty() {
        map.insert("allOf".to_owned(), Value::Array(vec![Value::Object(only)]));
        return;
    }
    for (key, value) in only {
        map.entry(key).or_insert(value);
    }
}

/// A doc comment's lines as paragraphs: the lines of a paragraph joined with
/// spaces, except before a list item; paragraphs kept apart by a blank line.
fn unwrap_lines(text: &str) -> String {
    let mut out = String::new();
    for paragraph in text.split("\n\n") {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        for (i, line) in paragraph.lines().map(str::trim).enumerate() {
            if i > 0 {
                let item = line.starts_with("- ") || line.starts_with("* ");
                out.push(if item { '\n' } else { ' ' });
            }
            out.push_str(line);
        }
    }
    out
}

/// A table with any keys, for a section the gateway accepts without
/// reading it.
pub(crate) fn any_table(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "additionalProperties": true })
}

/// An id written as a number or a string.
pub fn integer_or_string(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": ["integer", "string"] })
}

impl JsonSchema for EngineRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EngineRef".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^[a-z][a-z0-9_-]*(:[A-Za-z0-9._:/@][A-Za-z0-9._:/@-]*)?$",
        })
    }
}

/// Adds the reference layout's `keys` to a section's schema (a container
/// `transform`): an alias as our key's schema, an accepted key without a
/// use as any value; both marked deprecated, with what the gateway does
/// with them.
pub fn add_reference_keys(schema: &mut Schema, keys: &[ReferenceKey]) {
    for key in keys {
        match *key {
            ReferenceKey::Alias { theirs, ours } => add_reference_alias(schema, theirs, ours),
            ReferenceKey::Inert { key, what_happens } => add_reference_property(
                schema,
                key,
                json_schema!({
                    "description": format!("Accepted from the reference layout; {what_happens}."),
                }),
            ),
        }
    }
}

/// Adds `theirs`, the reference layout's name for our key `ours`, to a
/// section's schema: `ours`'s type, no default of its own.
pub fn add_reference_alias(schema: &mut Schema, theirs: &str, ours: &str) {
    let Some(mut alias) = schema.get("properties").and_then(|p| p.get(ours)).cloned() else {
        return;
    };
    if let Value::Object(alias) = &mut alias {
        alias.remove("default");
        alias.remove("examples");
        alias.insert(
            "description".to_owned(),
            format!(
                "The reference layout's name for `{ours}`, read as it; where both are written, \
                 `{ours}` is used."
            )
            .into(),
        );
    }
    add_reference_property(schema, theirs, alias.try_into().unwrap_or_else(|_| json_schema!({})));
}

/// Adds `key`, a key of the reference layout, with its schema `property`
/// (marked deprecated: a config written for this gateway uses ours).
pub fn add_reference_property(schema: &mut Schema, key: &str, mut property: Schema) {
    property.insert("deprecated".to_owned(), Value::Bool(true));
    let properties =
        schema.ensure_object().entry("properties").or_insert_with(|| Map::new().into());
    if let Value::Object(properties) = properties {
        properties.insert(key.to_owned(), property.to_value());
    }
}

#[cfg(test)]
mod tests;

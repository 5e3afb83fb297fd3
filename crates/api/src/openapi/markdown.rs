//! The HTTP API reference page of the book, rendered from the OpenAPI
//! document: the routes grouped by tag, each with its method and path,
//! summary, parameters, request body fields and responses (status, body and,
//! for a successful JSON body, its fields), then every type those bodies
//! name. The page is `docs/reference/http-api.md`; a test renders it again
//! and fails when the checked-in copy differs.
//!
//! It reads the document as JSON, the form clients get, and renders only
//! what the document says: a word on the page that is wrong is wrong in
//! the document too.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::{Map, Value};

/// The methods a route may have, in the order the page lists them.
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// The page for `doc`.
pub fn render(doc: &utoipa::openapi::OpenApi) -> String {
    let doc = serde_json::to_value(doc).unwrap_or(Value::Null);
    Page::new(&doc).render()
}

/// One operation of the document.
struct Operation<'a> {
    method: &'a str,
    path: &'a str,
    body: &'a Value,
}

struct Page<'a> {
    doc: &'a Value,
    schemas: &'a Map<String, Value>,
    /// Operations by tag, tags in name order, operations by path then method.
    groups: BTreeMap<String, Vec<Operation<'a>>>,
    /// The types the page describes under "Types", in name order.
    types: BTreeSet<String>,
    /// Heading anchors, as the book and GitHub make them: each heading's
    /// text, lowercased, spaces as `-`, other punctuation dropped, and a
    /// repeated one with `-1`, `-2`… after it, in page order.
    anchors: BTreeMap<String, String>,
    out: String,
}

/// What a heading is for: a tag's group, an operation or a type.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Tag,
    Operation,
    Type,
}

impl<'a> Page<'a> {
    fn new(doc: &'a Value) -> Self {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let schemas = doc
            .pointer("/components/schemas")
            .and_then(Value::as_object)
            .unwrap_or_else(|| EMPTY.get_or_init(Map::new));
        let mut groups: BTreeMap<String, Vec<Operation<'a>>> = BTreeMap::new();
        for (path, item) in doc.get("paths").and_then(Value::as_object).into_iter().flatten() {
            for method in METHODS {
                let Some(body) = item.get(method) else { continue };
                let tag =
                    body.pointer("/tags/0").and_then(Value::as_str).unwrap_or("other").to_owned();
                groups.entry(tag).or_default().push(Operation { method, path, body });
            }
        }
        let mut page = Page {
            doc,
            schemas,
            groups,
            types: BTreeSet::new(),
            anchors: BTreeMap::new(),
            out: String::new(),
        };
        page.collect_types();
        page.make_anchors();
        page
    }

    /// Every component a route's parameters or bodies name, and every one
    /// those name in turn, that has fields or values to list.
    fn collect_types(&mut self) {
        let mut seen = BTreeSet::new();
        let mut todo = Vec::new();
        for operation in self.groups.values().flatten() {
            refs_in(operation.body, &mut todo);
        }
        while let Some(name) = todo.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            if let Some(schema) = self.schemas.get(&name) {
                refs_in(schema, &mut todo);
            }
        }
        // An inline body equal to a component (the shared refusals) names it.
        for operation in self.groups.values().flatten() {
            for (_, response) in responses(operation.body) {
                for schema in contents(response).map(|(_, schema)| schema) {
                    if let Some(name) = self.component_equal_to(schema) {
                        seen.insert(name);
                    }
                }
            }
        }
        self.types = seen.into_iter().filter(|name| self.is_described_type(name)).collect();
    }

    fn is_described_type(&self, name: &str) -> bool {
        self.schemas.get(name).is_some_and(|schema| {
            schema.get("properties").is_some()
                || schema.get("enum").is_some()
                || schema.get("oneOf").is_some()
        })
    }

    fn make_anchors(&mut self) {
        let mut headings: Vec<(Kind, String, String)> =
            vec![(Kind::Tag, String::new(), "Contents".to_owned())];
        for (tag, operations) in &self.groups {
            headings.push((Kind::Tag, tag.clone(), tag.clone()));
            for operation in operations {
                let title = operation_title(operation);
                headings.push((Kind::Operation, title.clone(), title));
            }
        }
        headings.push((Kind::Tag, String::new(), "Types".to_owned()));
        for name in &self.types {
            headings.push((Kind::Type, name.clone(), name.clone()));
        }
        let mut used: BTreeMap<String, usize> = BTreeMap::new();
        for (kind, key, text) in headings {
            let base = anchor_of(&text);
            let n = used.entry(base.clone()).or_default();
            let anchor = if *n == 0 { base } else { format!("{base}-{n}") };
            *n += 1;
            if !key.is_empty() {
                self.anchors.insert(format!("{}:{key}", kind as u8), anchor);
            }
        }
    }

    fn anchor(&self, kind: Kind, key: &str) -> String {
        self.anchors.get(&format!("{}:{key}", kind as u8)).cloned().unwrap_or_default()
    }

    fn render(mut self) -> String {
        self.intro();
        self.contents();
        let groups = std::mem::take(&mut self.groups);
        for (tag, operations) in &groups {
            let _ = writeln!(self.out, "## {tag}\n");
            if let Some(description) = self.tag_description(tag) {
                let _ = writeln!(self.out, "{description}\n");
            }
            for operation in operations {
                self.operation(operation);
            }
        }
        self.types_section();
        let mut out = self.out.trim_end().to_owned();
        out.push('\n');
        out
    }

    fn intro(&mut self) {
        let title = self.doc.pointer("/info/title").and_then(Value::as_str).unwrap_or("HTTP API");
        let _ = writeln!(self.out, "# {title}\n");
        let _ = writeln!(
            self.out,
            "<!-- Rendered from the OpenAPI document by `lemon_api::openapi::markdown`; edit the \
             handlers' annotations and doc comments, then run `LEMON_BLESS=1 cargo test -p \
             lemon-api http_api_reference`. -->\n"
        );
        if let Some(description) = self.doc.pointer("/info/description").and_then(Value::as_str) {
            let _ = writeln!(self.out, "{}\n", description.trim());
        }
        let n: usize = self.groups.values().map(Vec::len).sum();
        let _ = writeln!(
            self.out,
            "The gateway serves this document at `GET /v1/openapi.json`, with the routes of \
             the components that are on (the SMS inbox, calls) added. This page lists the {n} \
             routes of the API itself. A field that may be `null` says so in its type; in a \
             response, a required field is in every body, and one that is not is left out \
             when it does not apply.\n"
        );
    }

    fn contents(&mut self) {
        let _ = writeln!(self.out, "## Contents\n");
        let mut lines = Vec::new();
        for (tag, operations) in &self.groups {
            lines.push(format!("- [{tag}](#{})", self.anchor(Kind::Tag, tag)));
            for operation in operations {
                let title = operation_title(operation);
                let anchor = self.anchor(Kind::Operation, &title);
                let summary = summary_of(operation);
                let summary =
                    if summary.is_empty() { String::new() } else { format!(": {summary}") };
                lines.push(format!("  - [{title}](#{anchor}){}", one_line(&summary)));
            }
        }
        lines.push(format!("- [Types](#{})", anchor_of("Types")));
        let _ = writeln!(self.out, "{}\n", lines.join("\n"));
    }

    fn tag_description(&self, tag: &str) -> Option<String> {
        let tags = self.doc.get("tags")?.as_array()?;
        let entry = tags.iter().find(|entry| entry["name"] == tag)?;
        entry.get("description")?.as_str().map(str::to_owned)
    }

    fn operation(&mut self, operation: &Operation<'_>) {
        let title = operation_title(operation);
        // A heading that ends in `{…}` would be read as its attributes (a
        // path parameter as a class) by the book's Markdown: the braces are
        // escaped, and the heading's id stays the one its text gives.
        let heading = title.replace('{', "\\{").replace('}', "\\}");
        let _ = writeln!(self.out, "### {heading}\n");
        let summary = summary_of(operation);
        if !summary.is_empty() {
            let _ = writeln!(self.out, "{summary}\n");
        }
        if let Some(description) = operation.body.get("description").and_then(Value::as_str) {
            if !description.trim().is_empty() {
                let _ = writeln!(self.out, "{}\n", description.trim());
            }
        }
        self.parameters(operation.body);
        self.request_body(operation.body);
        self.responses(operation.body);
    }

    fn parameters(&mut self, operation: &Value) {
        let Some(parameters) = operation.get("parameters").and_then(Value::as_array) else {
            return;
        };
        if parameters.is_empty() {
            return;
        }
        let mut rows = Vec::new();
        for parameter in parameters {
            let schema = parameter.get("schema").unwrap_or(&Value::Null);
            rows.push([
                format!("`{}`", text(parameter, "name")),
                text(parameter, "in"),
                self.type_text(schema),
                yes_no(parameter.get("required") == Some(&Value::Bool(true))),
                cell(&self.description_of(parameter, schema)),
            ]);
        }
        self.out.push_str("Parameters:\n\n");
        table(&mut self.out, ["Name", "In", "Type", "Required", "Description"], rows);
    }

    fn request_body(&mut self, operation: &Value) {
        let Some(body) = operation.get("requestBody") else { return };
        for (content_type, schema) in contents(body) {
            let required = body.get("required") == Some(&Value::Bool(true));
            let _ = writeln!(
                self.out,
                "Request body ({}, `{content_type}`):\n",
                if required { "required" } else { "optional" }
            );
            match self.field_rows(schema) {
                Some(rows) => {
                    let named = self.type_text(schema);
                    let _ = writeln!(self.out, "{named}:\n");
                    table(&mut self.out, ["Field", "Type", "Required", "Description"], rows);
                }
                None => {
                    let named = self.type_text(schema);
                    let _ = writeln!(self.out, "{named}\n");
                }
            }
        }
    }

    fn responses(&mut self, operation: &Value) {
        let mut rows = Vec::new();
        let mut bodies = Vec::new();
        for (status, response) in responses(operation) {
            let mut types = Vec::new();
            for (content_type, schema) in contents(response) {
                let shown = match content_type {
                    "application/json" => self.type_text(schema),
                    "text/event-stream" => format!("events: {}", self.type_text(schema)),
                    other => format!("`{other}`"),
                };
                types.push(shown);
                if status.starts_with('2') && content_type == "application/json" {
                    bodies.push((status.to_owned(), schema));
                }
            }
            let body = if types.is_empty() { "none".to_owned() } else { types.join(", or ") };
            rows.push([format!("`{status}`"), body, cell(&text(response, "description"))]);
        }
        self.out.push_str("Responses:\n\n");
        table(&mut self.out, ["Status", "Body", "Description"], rows);
        for (status, schema) in bodies {
            if let Some(rows) = self.field_rows(schema) {
                let named = self.type_text(schema);
                let _ = writeln!(self.out, "`{status}` {named}:\n");
                table(&mut self.out, ["Field", "Type", "Required", "Description"], rows);
            }
        }
    }

    fn types_section(&mut self) {
        self.out.push_str("## Types\n\nThe types the bodies above name, in name order.\n\n");
        let names: Vec<String> = self.types.iter().cloned().collect();
        for name in &names {
            let Some(schema) = self.schemas.get(name) else { continue };
            let _ = writeln!(self.out, "### {name}\n");
            if let Some(description) = schema.get("description").and_then(Value::as_str) {
                let _ = writeln!(self.out, "{}\n", description.trim());
            }
            if let Some(values) = schema.get("enum").and_then(Value::as_array) {
                let values: Vec<String> =
                    values.iter().map(|v| format!("`{}`", plain(v))).collect();
                let _ = writeln!(self.out, "One of {}.\n", values.join(", "));
            } else if let Some(choices) = schema.get("oneOf").and_then(Value::as_array) {
                let choices: Vec<String> = choices.iter().map(|c| self.type_text(c)).collect();
                let _ = writeln!(self.out, "Either {}.\n", choices.join(", or "));
            } else if let Some(rows) = self.field_rows(schema) {
                table(&mut self.out, ["Field", "Type", "Required", "Description"], rows);
            }
        }
    }

    /// The rows of a table of `schema`'s fields (through a `$ref`); `None`
    /// when it has no fields.
    fn field_rows(&self, schema: &Value) -> Option<Vec<[String; 4]>> {
        let schema = self.resolve(schema);
        let properties = schema.get("properties")?.as_object()?;
        let required: BTreeSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let rows = properties
            .iter()
            .map(|(name, property)| {
                [
                    format!("`{name}`"),
                    self.type_text(property),
                    yes_no(required.contains(name.as_str())),
                    cell(&self.description_of(property, property)),
                ]
            })
            .collect();
        Some(rows)
    }

    /// `schema` itself, or the component its `$ref` names.
    fn resolve<'s>(&'s self, schema: &'s Value) -> &'s Value {
        match schema.get("$ref").and_then(Value::as_str).and_then(component_name) {
            Some(name) => self.schemas.get(name).unwrap_or(schema),
            None => schema,
        }
    }

    /// The component whose schema is `schema`, word for word.
    fn component_equal_to(&self, schema: &Value) -> Option<String> {
        // Only an object's schema names a component; `{}` would name any.
        schema.get("properties")?;
        self.schemas
            .iter()
            .find(|(_, component)| *component == schema)
            .map(|(name, _)| name.clone())
    }

    /// The description of a field or parameter (for one that may be `null`,
    /// on its choices), else of the type it names.
    fn description_of(&self, holder: &Value, schema: &Value) -> String {
        let own = holder.get("description").and_then(Value::as_str);
        let on_a_choice = || {
            schema
                .get("oneOf")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find_map(|choice| choice.get("description").and_then(Value::as_str))
        };
        let named = || self.resolve(schema).get("description").and_then(Value::as_str);
        one_line(own.or_else(on_a_choice).or_else(named).unwrap_or_default().trim())
    }

    /// How a type reads in a table: a link to a described type, or words.
    fn type_text(&self, schema: &Value) -> String {
        if let Some(name) = schema.get("$ref").and_then(Value::as_str).and_then(component_name) {
            if self.types.contains(name) {
                return format!("[{name}](#{})", self.anchor(Kind::Type, name));
            }
            return match self.schemas.get(name) {
                Some(component) => self.type_text(component),
                None => name.to_owned(),
            };
        }
        if let Some(name) = self.component_equal_to(schema) {
            if self.types.contains(&name) {
                return format!("[{name}](#{})", self.anchor(Kind::Type, &name));
            }
        }
        for (key, joiner) in [("oneOf", " or "), ("anyOf", " or "), ("allOf", " and ")] {
            if let Some(choices) = schema.get(key).and_then(Value::as_array) {
                let mut texts: Vec<String> = choices.iter().map(|c| self.type_text(c)).collect();
                // `null` last: "Run or null".
                texts.sort_by_key(|text| text == "null");
                return texts.join(joiner);
            }
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            let values: Vec<String> = values.iter().map(|v| format!("`{}`", plain(v))).collect();
            return values.join(" \\| ");
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if types.is_empty() {
            return "any JSON".to_owned();
        }
        let texts: Vec<String> = types
            .iter()
            .map(|kind| match *kind {
                "array" => match schema.get("items") {
                    Some(items) => format!("array of {}", self.type_text(items)),
                    None => "array".to_owned(),
                },
                "object" => match (schema.get("properties"), schema.get("additionalProperties")) {
                    (Some(Value::Object(fields)), _) if !fields.is_empty() => {
                        let names: Vec<String> = fields.keys().map(|k| format!("`{k}`")).collect();
                        format!("object with {}", names.join(", "))
                    }
                    (_, Some(values)) if values.is_object() => {
                        format!("map of {}", self.type_text(values))
                    }
                    _ => "object".to_owned(),
                },
                other => other.to_owned(),
            })
            .collect();
        let mut texts = texts;
        texts.sort_by_key(|text| text == "null");
        texts.join(" or ")
    }
}

/// Every component name `value` refers to.
fn refs_in(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(name) = map.get("$ref").and_then(Value::as_str).and_then(component_name) {
                out.push(name.to_owned());
            }
            map.values().for_each(|v| refs_in(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs_in(v, out)),
        _ => {}
    }
}

fn component_name(reference: &str) -> Option<&str> {
    reference.strip_prefix("#/components/schemas/")
}

/// An operation's responses, by status, in status order.
fn responses(operation: &Value) -> Vec<(&str, &Value)> {
    let mut out: Vec<(&str, &Value)> = operation
        .get("responses")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(status, response)| (status.as_str(), response))
        .collect();
    out.sort_by_key(|(status, _)| *status);
    out
}

/// A body's schemas by content type, JSON first.
fn contents(body: &Value) -> impl Iterator<Item = (&str, &Value)> {
    let mut out: Vec<(&str, &Value)> = body
        .get("content")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(content_type, media)| {
            (content_type.as_str(), media.get("schema").unwrap_or(&Value::Null))
        })
        .collect();
    out.sort_by_key(|(content_type, _)| *content_type != "application/json");
    out.into_iter()
}

fn operation_title(operation: &Operation<'_>) -> String {
    format!("{} {}", operation.method.to_ascii_uppercase(), operation.path)
}

/// The operation's summary without a leading `` `METHOD path` `` (its
/// heading says that), as one line.
fn summary_of(operation: &Operation<'_>) -> String {
    let summary = text(operation.body, "summary");
    let own = format!("`{}`", operation_title(operation));
    let rest = summary.trim().strip_prefix(&own).unwrap_or(&summary);
    let rest = rest.trim_start_matches([':', '.', ',']).trim();
    let mut rest = one_line(rest);
    if let Some(first) = rest.chars().next() {
        let upper: String = first.to_uppercase().collect();
        rest.replace_range(..first.len_utf8(), &upper);
    }
    rest
}

fn text(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// A JSON value as the words of a page: strings without their quotes.
fn plain(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn yes_no(yes: bool) -> String {
    if yes { "yes" } else { "no" }.to_owned()
}

/// Text on one line: the lines of a doc comment joined by spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text fit for a table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// A heading's anchor, as mdBook and GitHub make it.
pub(crate) fn anchor_of(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

fn table<const N: usize>(out: &mut String, header: [&str; N], rows: Vec<[String; N]>) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", " --- |".repeat(N));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out.push('\n');
}

#[cfg(test)]
mod tests;

//! Whether a JSON body has the shape the OpenAPI document gives it, for the
//! tests that hold the handlers to their descriptions. The check is stricter
//! than JSON Schema's defaults: an object described with properties may have
//! no other key, so a field a handler writes and the document does not list
//! fails as surely as a listed one that is missing or of another type.
//!
//! It reads the subset of JSON Schema the document uses: `$ref`, `oneOf`,
//! `anyOf`, `allOf`, `enum`, `type` (one or a list), `properties`,
//! `required`, `additionalProperties`, `items` and `minimum`.

use serde_json::Value;

/// The schema `doc` gives the body of the `status` response of `method path`
/// (`"get"`, `"/v1/runs/{id}"`) in `content_type`; `None` when it gives none.
pub fn response_schema<'a>(
    doc: &'a Value,
    method: &str,
    path: &str,
    status: u16,
    content_type: &str,
) -> Option<&'a Value> {
    let operation = doc.get("paths")?.get(path)?.get(method.to_ascii_lowercase())?;
    let response = operation.get("responses")?.get(status.to_string())?;
    response.get("content")?.get(content_type)?.get("schema")
}

/// What is wrong with `body` as an instance of `schema`, whose `$ref`s point
/// into `doc`: one line per problem, naming where (`/runs/0/status`).
/// Empty when it conforms.
pub fn problems(doc: &Value, schema: &Value, body: &Value) -> Vec<String> {
    let mut found = Vec::new();
    check(doc, schema, body, "", &mut found);
    found
}

fn check(doc: &Value, schema: &Value, body: &Value, at: &str, found: &mut Vec<String>) {
    let here = if at.is_empty() { "/" } else { at };
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        match target.strip_prefix('#').and_then(|pointer| doc.pointer(pointer)) {
            Some(resolved) => check(doc, resolved, body, at, found),
            None => found.push(format!("{here}: $ref {target} does not resolve")),
        }
        return;
    }
    if let Some(choices) = schema.get("oneOf").and_then(Value::as_array) {
        let matching = choices.iter().filter(|choice| problems(doc, choice, body).is_empty());
        let n = matching.count();
        if n != 1 {
            found.push(format!("{here}: {n} of oneOf's {} schemas match {body}", choices.len()));
        }
    }
    if let Some(choices) = schema.get("anyOf").and_then(Value::as_array) {
        if !choices.iter().any(|choice| problems(doc, choice, body).is_empty()) {
            found.push(format!("{here}: none of anyOf's schemas matches {body}"));
        }
    }
    for part in schema.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        check(doc, part, body, at, found);
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        if !values.contains(body) {
            found.push(format!("{here}: {body} is not one of {}", Value::Array(values.clone())));
        }
    }
    if let Some(minimum) = schema.get("minimum").and_then(Value::as_f64) {
        if body.as_f64().is_some_and(|n| n < minimum) {
            found.push(format!("{here}: {body} is below the minimum {minimum}"));
        }
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !types.is_empty() && !types.iter().any(|kind| is_of_type(body, kind)) {
        found.push(format!("{here}: {body} is not of type {}", types.join(" or ")));
        return;
    }
    match body {
        Value::Object(object) => check_object(doc, schema, object, at, found),
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (index, value) in items.iter().enumerate() {
                    check(doc, item, value, &format!("{at}/{index}"), found);
                }
            }
        }
        _ => {}
    }
}

fn check_object(
    doc: &Value,
    schema: &Value,
    object: &serde_json::Map<String, Value>,
    at: &str,
    found: &mut Vec<String>,
) {
    let here = if at.is_empty() { "/" } else { at };
    let properties = schema.get("properties").and_then(Value::as_object);
    for key in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
        if let Some(key) = key.as_str() {
            if !object.contains_key(key) {
                found.push(format!("{here}: required key {key:?} is missing"));
            }
        }
    }
    let additional = schema.get("additionalProperties");
    for (key, value) in object {
        let path = format!("{at}/{key}");
        match (properties.and_then(|p| p.get(key)), additional) {
            (Some(property), _) => check(doc, property, value, &path, found),
            (None, Some(Value::Bool(false))) => {
                found.push(format!("{here}: key {key:?} is not allowed"));
            }
            (None, Some(Value::Bool(true))) => {}
            (None, Some(extra)) => check(doc, extra, value, &path, found),
            // Listed properties and nothing said of others: only those.
            (None, None) if properties.is_some() => {
                found.push(format!("{here}: key {key:?} is not in the document"));
            }
            (None, None) => {}
        }
    }
}

fn is_of_type(value: &Value, kind: &str) -> bool {
    match kind {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => false,
    }
}

#[cfg(test)]
mod tests;

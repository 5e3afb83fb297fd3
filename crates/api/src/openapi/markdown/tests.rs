//! The HTTP API reference page: the checked-in copy is what the code
//! renders, every route is on it, and every link on it leads to a heading.

use std::collections::BTreeMap;

use serde_json::json;

use super::{anchor_of, render};
use crate::openapi::{document, routes};

/// The page, from the crate's folder.
const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reference/http-api.md");

/// The line to run when the page is out of date.
const BLESS: &str = "LEMON_BLESS=1 cargo test -p lemon-api http_api_reference";

#[test]
fn http_api_reference_is_what_the_document_renders() {
    let rendered = render(&document());
    if std::env::var_os("LEMON_BLESS").is_some() {
        let page = std::path::Path::new(PAGE);
        std::fs::create_dir_all(page.parent().unwrap()).unwrap();
        std::fs::write(page, &rendered).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(PAGE).unwrap_or_default();
    if checked_in == rendered {
        return;
    }
    let differs = checked_in
        .lines()
        .zip(rendered.lines())
        .position(|(old, new)| old != new)
        .unwrap_or_else(|| checked_in.lines().count().min(rendered.lines().count()));
    let line = |text: &str| text.lines().nth(differs).unwrap_or("(end of page)").to_owned();
    panic!(
        "docs/reference/http-api.md is not the page the OpenAPI document renders; \
         regenerate it with `{BLESS}`.\nFirst difference, line {}:\n  checked in: {}\n  rendered:   {}",
        differs + 1,
        line(&checked_in),
        line(&rendered),
    );
}

#[test]
fn http_api_reference_lists_every_route_of_the_document_once() {
    let page = render(&document());
    // A heading's braces are escaped for the book's Markdown.
    let unescaped: Vec<String> = page
        .lines()
        .filter_map(|line| line.strip_prefix("### "))
        .filter(|h| h.contains(" /v1/"))
        .map(|h| h.replace("\\{", "{").replace("\\}", "}"))
        .collect();
    let headings: Vec<&str> = unescaped.iter().map(String::as_str).collect();
    let documented = routes::documented(&document());
    assert_eq!(headings, documented_in_page_order(&headings, &documented));
    let mut sorted = headings.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, documented, "each documented route has one heading");
    let said = format!("lists the {} routes", documented.len());
    assert!(page.contains(&said), "the page states its route count: {said}");
}

/// `documented` in the order the page has them.
fn documented_in_page_order<'a>(headings: &[&'a str], documented: &[String]) -> Vec<&'a str> {
    headings
        .iter()
        .copied()
        .filter(|heading| documented.iter().any(|route| route == heading))
        .collect()
}

#[test]
fn every_link_on_the_page_leads_to_a_heading_on_it() {
    let page = render(&document());
    let anchors = heading_anchors(&page);
    let mut broken = Vec::new();
    for piece in page.split("](#").skip(1) {
        let target = piece.split(')').next().unwrap_or_default();
        if !anchors.contains_key(target) {
            broken.push(target.to_owned());
        }
    }
    assert!(broken.is_empty(), "links to no heading: {broken:?}");
    assert!(page.matches("](#").count() > 100, "the page links its types");
}

/// The anchor of every heading of `page`, as mdBook and GitHub number a
/// repeated one.
fn heading_anchors(page: &str) -> BTreeMap<String, String> {
    let mut anchors = BTreeMap::new();
    let mut used: BTreeMap<String, usize> = BTreeMap::new();
    for line in page.lines() {
        let Some(heading) = line.strip_prefix('#').map(|rest| rest.trim_start_matches('#')) else {
            continue;
        };
        let base = anchor_of(heading.trim());
        let n = used.entry(base.clone()).or_default();
        let anchor = if *n == 0 { base } else { format!("{base}-{n}") };
        *n += 1;
        anchors.insert(anchor, heading.trim().to_owned());
    }
    anchors
}

#[test]
fn anchors_are_made_as_the_book_makes_them() {
    assert_eq!(anchor_of("GET /v1/runs/{id}"), "get-v1runsid");
    assert_eq!(anchor_of("POST /v1/sessions/{key}/budget"), "post-v1sessionskeybudget");
    assert_eq!(anchor_of("ClusterConfig_2"), "clusterconfig_2");
}

/// A small document: one route with a parameter, a body and two answers, and
/// a tag whose name is also a type's.
fn small_document() -> utoipa::openapi::OpenApi {
    serde_json::from_value(json!({
        "openapi": "3.1.0",
        "info": { "title": "Small API", "version": "1", "description": "A small API." },
        "paths": {
            "/v1/status/{id}": {
                "put": {
                    "tags": ["status"],
                    "summary": "`PUT /v1/status/{id}`: sets a status.",
                    "description": "It replaces the one before.",
                    "operationId": "put_status",
                    "parameters": [{
                        "name": "id", "in": "path", "required": true,
                        "description": "The status id.", "schema": { "type": "string" },
                    }],
                    "requestBody": {
                        "required": true,
                        "content": { "application/json": {
                            "schema": { "$ref": "#/components/schemas/Status" },
                        }},
                    },
                    "responses": {
                        "200": {
                            "description": "Set.",
                            "content": { "application/json": {
                                "schema": { "$ref": "#/components/schemas/Status" },
                            }},
                        },
                        "404": { "description": "No such status | none." },
                    },
                },
            },
        },
        "components": { "schemas": {
            "Status": {
                "type": "object",
                "description": "A status.",
                "required": ["state"],
                "properties": {
                    "state": { "$ref": "#/components/schemas/State" },
                    "note": { "type": ["string", "null"], "description": "Why." },
                    "counts": { "type": "object", "additionalProperties": { "type": "integer" } },
                },
            },
            "State": { "type": "string", "enum": ["on", "off"], "description": "On or off." },
        }},
    }))
    .unwrap()
}

#[test]
fn a_route_shows_its_summary_parameters_body_and_answers() {
    let page = render(&small_document());
    for expected in [
        "# Small API\n",
        "A small API.\n",
        "lists the 1 routes",
        "- [status](#status)\n  - [PUT /v1/status/{id}](#put-v1statusid): Sets a status.\n",
        "## status\n",
        "### PUT /v1/status/\\{id\\}\n\nSets a status.\n\nIt replaces the one before.\n",
        "| `id` | path | string | yes | The status id. |",
        "Request body (required, `application/json`):\n\n[Status](#status-1):\n",
        "| `state` | [State](#state) | yes | On or off. |",
        "| `note` | string or null | no | Why. |",
        "| `counts` | map of integer | no |  |",
        "| `200` | [Status](#status-1) | Set. |",
        "| `404` | none | No such status \\| none. |",
        "### Status\n\nA status.\n",
        "### State\n\nOn or off.\n\nOne of `on`, `off`.\n",
    ] {
        assert!(page.contains(expected), "{expected:?} is not on the page:\n{page}");
    }
    let anchors = heading_anchors(&page);
    assert_eq!(anchors.get("status").map(String::as_str), Some("status"));
    assert_eq!(anchors.get("status-1").map(String::as_str), Some("Status"));
}

#[test]
fn every_route_has_a_summary_of_its_own() {
    let doc = serde_json::to_value(document()).unwrap();
    let mut missing = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, body) in item.as_object().unwrap() {
            let operation = super::Operation { method, path, body };
            if super::summary_of(&operation).len() < 12 {
                missing.push(super::operation_title(&operation));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "routes whose doc comment says nothing more than their path: {missing:?}"
    );
}

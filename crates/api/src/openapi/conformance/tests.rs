//! The conformance check finds what it is there to find.

use serde_json::{json, Value};

use super::problems;

/// A document with one component, `Run`, the way utoipa writes one.
fn doc() -> Value {
    json!({
        "components": { "schemas": {
            "Status": { "type": "string", "enum": ["queued", "completed"] },
            "Run": {
                "type": "object",
                "required": ["run_id", "status", "answer"],
                "properties": {
                    "run_id": { "type": "string" },
                    "status": { "$ref": "#/components/schemas/Status" },
                    "answer": { "type": ["string", "null"] },
                    "tokens": { "type": "integer", "format": "int64", "minimum": 0 },
                    "calls": { "type": "object", "additionalProperties": { "type": "integer" } },
                    "tags": { "type": "array", "items": { "type": "string" } },
                    "resume": { "oneOf": [{ "type": "null" }, { "$ref": "#/components/schemas/Status" }] },
                },
            },
        }},
    })
}

fn check(body: Value, expected: &[&str]) {
    let doc = doc();
    let schema = json!({ "$ref": "#/components/schemas/Run" });
    assert_eq!(problems(&doc, &schema, &body), expected, "{body}");
}

#[test]
fn a_body_of_the_documented_shape_conforms() {
    check(json!({ "run_id": "r1", "status": "queued", "answer": null }), &[]);
    check(
        json!({
            "run_id": "r1", "status": "completed", "answer": "hi", "tokens": 3,
            "calls": { "ok": 2 }, "tags": ["a"], "resume": "queued",
        }),
        &[],
    );
}

#[test]
fn every_way_a_body_can_differ_is_found() {
    check(
        json!({ "run_id": "r1", "status": "queued" }),
        &["/: required key \"answer\" is missing"],
    );
    check(
        json!({ "run_id": "r1", "status": "queued", "answer": null, "extra": 1 }),
        &["/: key \"extra\" is not in the document"],
    );
    check(
        json!({ "run_id": 7, "status": "running", "answer": null }),
        &[
            "/run_id: 7 is not of type string",
            "/status: \"running\" is not one of [\"queued\",\"completed\"]",
        ],
    );
    check(
        json!({ "run_id": "r1", "status": "queued", "answer": null, "tokens": -1 }),
        &["/tokens: -1 is below the minimum 0"],
    );
    check(
        json!({ "run_id": "r1", "status": "queued", "answer": null, "tokens": 1.5 }),
        &["/tokens: 1.5 is not of type integer"],
    );
    check(
        json!({ "run_id": "r1", "status": "queued", "answer": null, "calls": { "ok": "2" } }),
        &["/calls/ok: \"2\" is not of type integer"],
    );
    check(
        json!({ "run_id": "r1", "status": "queued", "answer": null, "tags": ["a", 2] }),
        &["/tags/1: 2 is not of type string"],
    );
    check(
        json!({ "run_id": "r1", "status": "queued", "answer": null, "resume": "gone" }),
        &["/resume: 0 of oneOf's 2 schemas match \"gone\""],
    );
    let doc = doc();
    let nowhere = json!({ "$ref": "#/components/schemas/Nowhere" });
    assert_eq!(
        problems(&doc, &nowhere, &json!({})),
        ["/: $ref #/components/schemas/Nowhere does not resolve"]
    );
}

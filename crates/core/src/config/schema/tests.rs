//! Tests of the schema, the reference page and the starter file, over
//! core's own keys (the other crates' sections as any table).

use std::path::Path;

use super::*;

fn core_only() -> Value {
    let sections: Vec<SectionSchema> =
        OWNED_SECTIONS.iter().map(|key| SectionSchema { key, schema: any_table }).collect();
    document(&sections).expect("every section is given")
}

/// Every schema of `value` (the document and all below it), with its path.
fn each_schema<'a>(value: &'a Value, at: String, out: &mut Vec<(String, &'a Value)>) {
    out.push((at.clone(), value));
    let Value::Object(map) = value else { return };
    for (key, inner) in map {
        match (key.as_str(), inner) {
            (k, Value::Object(named)) if NAMED.contains(&k) => {
                for (name, schema) in named {
                    each_schema(schema, format!("{at}/{k}/{name}"), out);
                }
            }
            (k, Value::Array(items)) if LIST.contains(&k) || k == "items" => {
                for (i, schema) in items.iter().enumerate() {
                    each_schema(schema, format!("{at}/{k}/{i}"), out);
                }
            }
            (k, inner) if ONE.contains(&k) => each_schema(inner, format!("{at}/{k}"), out),
            _ => {}
        }
    }
}

#[test]
fn the_sections_given_must_be_the_ones_core_leaves_to_other_crates() {
    let all: Vec<SectionSchema> =
        OWNED_SECTIONS.iter().map(|key| SectionSchema { key, schema: any_table }).collect();
    assert_eq!(document(&all[1..]).unwrap_err(), SchemaError::Missing("engines"));
    let twice = [all.clone(), vec![all[2]]].concat();
    assert_eq!(document(&twice).unwrap_err(), SchemaError::Twice("discord"));
    let unknown = [all, vec![SectionSchema { key: "queue", schema: any_table }]].concat();
    assert_eq!(document(&unknown).unwrap_err(), SchemaError::Unknown("queue"));
    assert_eq!(SchemaError::Missing("sms").to_string(), "no schema was given for [gateway.sms]");
}

#[test]
fn the_document_is_toml_shaped() {
    let document = core_only();
    assert_eq!(document["$schema"], "http://json-schema.org/draft-07/schema#");
    let mut schemas = Vec::new();
    each_schema(&document, String::new(), &mut schemas);
    for (at, schema) in &schemas {
        let text = serde_json::to_string(schema).unwrap();
        // TOML has no null: an unset key is absent.
        assert!(schema.get("type") != Some(&Value::from("null")), "{at}: {text}");
        if let Some(Value::Array(types)) = schema.get("type") {
            assert!(!types.contains(&Value::from("null")), "{at}: {text}");
        }
        assert!(schema.get("default").is_none_or(|d| !d.is_null() && !d.is_object()), "{at}");
        // A table's unknown keys are refused unless it says otherwise.
        if schema.get("properties").is_some() {
            assert!(schema.get("additionalProperties").is_some(), "{at}: {text}");
        }
        assert!(schema.get(SLOT).is_none(), "{at}: a mark was left");
        if let Some(format) = schema.get("format").and_then(Value::as_str) {
            assert!(!RUST_FORMATS.contains(&format), "{at}: {format}");
        }
    }
    let gateway = &document["definitions"]["GatewayConfig"];
    assert_eq!(gateway["additionalProperties"], false);
    let runs = &gateway["properties"]["max_concurrent_runs"];
    assert_eq!((&runs["default"], &runs["maximum"]), (&Value::from(2), &Value::from(4096)));
    // An optional key is its type alone, with its meaning.
    let cwd = &gateway["properties"]["default_cwd"];
    assert_eq!(cwd["type"], "string");
    assert!(cwd["description"].as_str().unwrap().contains("working directory"));
    // Descriptions are paragraphs, not the source's wrapped lines.
    let cluster = &document["definitions"]["ClusterConfig"]["description"];
    assert!(!cluster.as_str().unwrap().contains('\n'), "{cluster}");
}

#[test]
fn printed_json_is_sorted_and_ends_with_a_newline() {
    let value = serde_json::json!({ "b": [{ "z": 1, "a": 2 }], "a": true });
    assert_eq!(
        to_json(&value),
        "{\n  \"a\": true,\n  \"b\": [\n    {\n      \"a\": 2,\n      \"z\": 1\n    }\n  ]\n}\n"
    );
}

#[test]
fn wrapped_lines_become_paragraphs_and_list_items_stay_apart() {
    assert_eq!(unwrap_lines("one\ntwo\n\nthree\n- a\n- b"), "one two\n\nthree\n- a\n- b");
}

#[test]
fn reference_keys_join_a_sections_schema_marked_as_the_reference_layouts() {
    let mut schema = json_schema!({
        "type": "object",
        "properties": { "port": { "type": "integer", "default": 4041, "description": "Ours." } },
    });
    add_reference_keys(
        &mut schema,
        &[
            ReferenceKey::Alias { theirs: "webhook_port", ours: "port" },
            ReferenceKey::Inert { key: "mock_mode", what_happens: "there is no mock mode here" },
        ],
    );
    let alias = &schema.as_value()["properties"]["webhook_port"];
    assert_eq!(alias["type"], "integer");
    assert_eq!(alias["deprecated"], true);
    assert!(alias.get("default").is_none(), "an alias has no default of its own");
    assert!(alias["description"].as_str().unwrap().contains("`port` is used"));
    let inert = &schema.as_value()["properties"]["mock_mode"];
    assert_eq!(
        inert["description"],
        "Accepted from the reference layout; there is no mock mode here."
    );
    assert!(inert.get("type").is_none(), "any value");
}

#[test]
fn the_reference_has_a_section_per_table_and_a_row_per_key() {
    let document = core_only();
    let sections = markdown::sections(&document);
    let headers: Vec<&str> = sections.iter().map(|s| s.header.as_str()).collect();
    for expected in [
        "[gateway]",
        "[gateway.queue]",
        "[[gateway.bindings]]",
        "[gateway.bindings.budget]",
        "[gateway.projects.<name>]",
        "[[gateway.projects.<name>.approvals]]",
        "[gateway.budgets.prices.<model>]",
        "[[gateway.approvals.engines.<engine>]]",
        "[[gateway.cron]]",
        "[[gateway.mcp_servers]]",
    ] {
        assert!(headers.contains(&expected), "{expected}: {headers:?}");
    }
    let gateway = &sections[0];
    assert_eq!((gateway.header.as_str(), gateway.depth), ("[gateway]", 0));
    let queue = sections.iter().find(|s| s.header == "[gateway.queue]").unwrap();
    assert_eq!(queue.depth, 1);
    assert!(queue.description.as_deref().unwrap().starts_with("What happens"), "{queue:?}");
    let cap = queue.keys.iter().find(|k| k.name == "cap").unwrap();
    assert_eq!(
        (cap.kind.as_str(), cap.default.as_deref(), cap.allowed.as_deref()),
        ("integer", Some("100"), Some("1 to 1000000"))
    );
    let mode = queue.keys.iter().find(|k| k.name == "mode").unwrap();
    assert_eq!(
        mode.allowed.as_deref(),
        Some("`collect`, `followup`, `steer`, `steer_backlog`, `redirect`, `interrupt`")
    );
    assert!(mode.meaning.contains("\n- `interrupt`: Cancel the live run"), "{}", mode.meaning);
    let binding = sections.iter().find(|s| s.header == "[[gateway.bindings]]").unwrap();
    let transport = binding.keys.iter().find(|k| k.name == "transport").unwrap();
    assert!(transport.required);
    let chat = binding.keys.iter().find(|k| k.name == "chat_id").unwrap();
    assert_eq!(chat.kind, "integer or string");

    let page = markdown::render(&document);
    assert!(page.contains("- [`[gateway.queue]`](#gateway-queue)"), "the contents link each table");
    assert!(page.contains("<a id=\"gateway-queue\"></a>\n\n## `[gateway.queue]`"));
    assert!(page.contains("| `cap` | integer | `100` | 1 to 1000000 |"), "a row per key");
    assert!(page.contains("| `transport` | string | required |"));
    assert!(!page.contains("(#gateway-queue-2)"), "anchors are unique");
}

#[test]
fn the_starter_loads_as_the_defaults() {
    let document = core_only();
    let text = starter::render(&document, "./config.schema.json");
    assert!(text.starts_with("#:schema ./config.schema.json\n# "), "{text}");
    for table in starter::STARTER_TABLES {
        assert!(text.contains(&format!("\n{table}\n")), "{table}");
    }
    assert!(text.contains("# max_concurrent_runs = 2\n"), "{text}");
    assert!(text.contains("# default_engine = \"claude\"  # example\n"), "{text}");
    assert!(text.lines().all(|line| line.chars().count() <= 79 || line.contains(" = ")), "{text}");
    let loaded = super::super::load_str(&text, Path::new("config.toml")).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

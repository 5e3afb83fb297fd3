//! Tests of the config schema as the whole gateway gives it: every section
//! filled, the checked-in reference pages current, the reference layout's
//! example and the starter file valid, the starter loading without a
//! warning, and `config init` leaving an existing file alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lemon_core::config::schema::OWNED_SECTIONS;
use serde_json::Value;

use super::*;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compares a checked-in page with what the code prints; `LEMON_BLESS=1`
/// writes the printed one instead of failing.
fn check_checked_in(relative: &str, printed: &str, command: &str) {
    let path = workspace_root().join(relative);
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == printed {
        return;
    }
    if std::env::var("LEMON_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, printed).unwrap();
        return;
    }
    panic!(
        "{relative} differs from what the code prints. Regenerate it with \
         `LEMON_BLESS=1 cargo test -p lemon-gateway reference_docs` \
         (or `lemon-gateway {command} > {relative}`) and commit it."
    );
}

#[test]
fn reference_docs_config_schema_is_current() {
    check_checked_in("docs/reference/config.schema.json", &schema_json().unwrap(), "config schema");
}

#[test]
fn reference_docs_config_reference_is_current() {
    check_checked_in("docs/reference/config.md", &reference().unwrap(), "config reference");
}

#[test]
fn reference_docs_cli_reference_is_current() {
    let page = crate::cli_reference::render(&crate::cli::command());
    check_checked_in("docs/reference/cli.md", &page, "docs cli");
}

/// A small JSON Schema checker for the keywords the document uses, enough
/// to say whether a TOML file fits it: the problems, one per line.
struct Checker<'a> {
    root: &'a Value,
}

impl Checker<'_> {
    fn resolve<'s>(&'s self, schema: &'s Value) -> &'s Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let pointer = reference.trim_start_matches('#');
                self.resolve(self.root.pointer(pointer).expect("a $ref into the document"))
            }
            None => schema,
        }
    }

    fn problems(&self, schema: &Value, value: &toml::Value) -> Vec<String> {
        let mut out = Vec::new();
        self.check(schema, value, "", &mut out);
        out
    }

    fn check(&self, schema: &Value, value: &toml::Value, at: &str, out: &mut Vec<String>) {
        let schema = self.resolve(schema);
        let json = serde_json::to_value(value).unwrap();
        for inner in schema.get("allOf").and_then(Value::as_array).into_iter().flatten() {
            self.check(inner, value, at, out);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = schema.get(key).and_then(Value::as_array) {
                let fits = options.iter().any(|option| {
                    let mut problems = Vec::new();
                    self.check(option, value, at, &mut problems);
                    problems.is_empty()
                });
                if !fits {
                    out.push(format!("{at}: {json} is none of the choices"));
                }
            }
        }
        if schema.get("const").is_some_and(|c| *c != json) {
            out.push(format!("{at}: {json} is not {}", schema["const"]));
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            if !values.contains(&json) {
                out.push(format!("{at}: {json} is not one of {values:?}"));
            }
        }
        if let Some(kinds) = schema.get("type") {
            let kinds: Vec<&str> = match kinds {
                Value::String(kind) => vec![kind.as_str()],
                Value::Array(kinds) => kinds.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            let fits = kinds.iter().any(|kind| match *kind {
                "string" => value.is_str(),
                "integer" => value.is_integer(),
                "number" => value.is_integer() || value.is_float(),
                "boolean" => value.is_bool(),
                "array" => value.is_array(),
                "object" => value.is_table(),
                _ => false,
            });
            if !fits {
                out.push(format!("{at}: {json} is not of type {kinds:?}"));
            }
        }
        if let Some(number) = json.as_f64().filter(|_| json.is_number()) {
            if schema.get("minimum").and_then(Value::as_f64).is_some_and(|min| number < min) {
                out.push(format!("{at}: {number} is below the minimum"));
            }
            if schema.get("maximum").and_then(Value::as_f64).is_some_and(|max| number > max) {
                out.push(format!("{at}: {number} is above the maximum"));
            }
        }
        match value {
            toml::Value::Table(table) => {
                let properties = schema.get("properties").and_then(Value::as_object);
                for (key, inner) in table {
                    let path = format!("{at}.{key}");
                    match (properties.and_then(|p| p.get(key)), schema.get("additionalProperties"))
                    {
                        (Some(property), _) => self.check(property, inner, &path, out),
                        (None, Some(Value::Bool(false))) => {
                            out.push(format!("{path}: unknown key"))
                        }
                        (None, Some(other @ Value::Object(_))) => {
                            self.check(other, inner, &path, out)
                        }
                        (None, _) => {}
                    }
                }
                for name in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                    if !name.as_str().is_some_and(|name| table.contains_key(name)) {
                        out.push(format!("{at}: {name} is required"));
                    }
                }
            }
            toml::Value::Array(items) => {
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(item_schema, item, &format!("{at}[{i}]"), out);
                    }
                }
            }
            _ => {}
        }
    }
}

fn problems(text: &str) -> Vec<String> {
    let document = schema().unwrap();
    let value: toml::Value = text.parse::<toml::Table>().map(toml::Value::Table).unwrap();
    Checker { root: &document }.problems(&document, &value)
}

#[test]
fn every_section_another_crate_parses_has_its_schema() {
    let document = schema().unwrap();
    let text = schema::to_json(&document);
    assert!(!text.contains("x-lemon-section"), "a section was left unfilled");
    let gateway = &document["definitions"]["GatewayConfig"]["properties"];
    for key in OWNED_SECTIONS {
        let section = &gateway[*key];
        assert!(section.is_object(), "[gateway.{key}] has no schema");
        assert_ne!(section, &serde_json::json!({ "type": "object" }), "[gateway.{key}]");
    }
    let engines = gateway["engines"]["properties"].as_object().unwrap();
    let ids: Vec<&str> = engines.keys().map(String::as_str).collect();
    for id in ["echo", "lemon", "claude", "codex", "opencode", "pi", "droid"] {
        assert!(ids.contains(&id), "[gateway.engines.{id}] is missing: {ids:?}");
    }
}

#[test]
fn the_schema_accepts_the_reference_layouts_example_and_the_starter() {
    let example = include_str!("../../../../crates/core/src/config/reference_example.toml");
    assert_eq!(problems(example), Vec::<String>::new());
    assert_eq!(problems(&starter().unwrap()), Vec::<String>::new());
    // The starter with every line switched on is valid too.
    assert_eq!(problems(&switched_on(&starter().unwrap(), true)), Vec::<String>::new());
}

#[test]
fn the_schema_refuses_what_the_loader_reports() {
    for (text, expected) in [
        ("[gateway]\nmax_concurent_runs = 2\n", ".gateway.max_concurent_runs: unknown key"),
        (
            "[gateway]\nmax_concurrent_runs = \"two\"\n",
            ".gateway.max_concurrent_runs: \"two\" is not of type",
        ),
        (
            "[gateway]\nmax_concurrent_runs = 5000\n",
            ".gateway.max_concurrent_runs: 5000 is above the maximum",
        ),
        ("[gatway]\n", ".gatway: unknown key"),
        (
            "[gateway.queue]\nmode = \"sideways\"\n",
            ".gateway.queue.mode: \"sideways\" is none of the choices",
        ),
        ("[gateway.telegram]\nbot_tokn = \"1:a\"\n", ".gateway.telegram.bot_tokn: unknown key"),
        (
            "[gateway.telegram]\nvoice_max_bytes = 0\n",
            ".gateway.telegram.voice_max_bytes: 0 is below the minimum",
        ),
        ("[gateway.engines.cluade]\n", ".gateway.engines.cluade: unknown key"),
        ("[gateway.engines.lemon]\nprovider = \"mistral\"\n", ".gateway.engines.lemon.provider"),
        ("[[gateway.bindings]]\nchat_id = 1\n", ".gateway.bindings[0]: \"transport\" is required"),
        ("[gateway.email.smtp]\nsecurity = \"ssl\"\n", ".gateway.email.smtp.security"),
    ] {
        let found = problems(text);
        assert!(found.iter().any(|p| p.starts_with(expected)), "{text}: {found:?}");
    }
    // What the loader accepts from the reference layout, the schema accepts.
    for text in [
        "[gateway.telegram]\ntoken = \"1:a\"\n",
        "[gateway.discord]\ndeny_unbound_channels = true\n",
        "[gateway.xmtp]\nenvironment = \"production\"\nmock_mode = true\n",
        "[gateway.voice]\nwebsocket_port = 4047\nllm_model = \"gpt-4o\"\n",
        "[gateway.sms]\nwebhook_port = \"4041\"\nwebhook_enabled = \"yes\"\n",
        "[gateway.email]\nsmtp_relay = \"smtp.example.com\"\n[gateway.email.outbound]\ntls = \"always\"\n",
        "[gateway.engines.pi]\nthinking = \"high\"\n",
        "[gateway.dashboard]\ntheme = \"dark\"\n",
    ] {
        assert_eq!(problems(text), Vec::<String>::new(), "{text}");
    }
}

/// `text` with every commented `# key = value` line switched on (with the
/// examples, or without them).
fn switched_on(text: &str, examples: bool) -> String {
    text.lines()
        .map(|line| {
            let Some(rest) = line.strip_prefix("# ") else { return line.to_owned() };
            let is_key = rest.split_once(" = ").is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            let example = rest.ends_with(schema::starter::EXAMPLE_MARK);
            if is_key && (examples || !example) {
                rest.to_owned()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks `text` as `config check` does; the warnings.
fn check(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(&file, text).unwrap();
    let paths = lemon_server::paths::Paths { home: dir.path().to_owned(), config: file.clone() };
    let env: BTreeMap<String, String> = [("LEMON_KEYCHAIN".to_owned(), "off".to_owned())].into();
    lemon_server::check_config(&file, &paths, &env).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn the_starter_loads_without_a_warning_and_its_lines_are_the_defaults() {
    let text = starter().unwrap();
    assert!(text.starts_with("#:schema ./config.schema.json\n"), "{text}");
    assert_eq!(check(&text), Vec::<String>::new());
    // Every default switched on loads the same config as none.
    let defaults = switched_on(&text, false);
    assert_ne!(defaults, text, "the starter shows defaults");
    assert_eq!(check(&defaults), Vec::<String>::new(), "{defaults}");
    let loaded = lemon_core::config::load_str(&defaults, Path::new("config.toml")).unwrap();
    let empty = lemon_core::config::load_str("", Path::new("config.toml")).unwrap();
    assert_eq!(
        serde_json::to_value(&loaded.config).unwrap(),
        serde_json::to_value(&empty.config).unwrap()
    );
    // With the examples too, it still loads without a warning.
    assert_eq!(check(&switched_on(&text, true)), Vec::<String>::new());
}

#[test]
fn init_writes_the_starter_and_the_schema_and_keeps_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("home").join("config.toml");
    let written = init(&config, false).unwrap();
    assert_eq!(written.schema, dir.path().join("home").join(SCHEMA_FILE));
    assert_eq!(std::fs::read_to_string(&config).unwrap(), starter().unwrap());
    assert_eq!(std::fs::read_to_string(&written.schema).unwrap(), schema_json().unwrap());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&config), 0o600, "the config may come to hold tokens");
        assert_eq!(mode(config.parent().unwrap()), 0o700);
    }

    std::fs::write(&config, "[gateway]\nmax_concurrent_runs = 7\n").unwrap();
    let refused = init(&config, false).unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("already exists") && message.contains("--force"), "{message}");
    assert!(message.contains(&config.display().to_string()), "{message}");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "[gateway]\nmax_concurrent_runs = 7\n",
        "an existing file is left as it is"
    );

    init(&config, true).unwrap();
    assert_eq!(std::fs::read_to_string(&config).unwrap(), starter().unwrap());
    let leftovers: Vec<_> = std::fs::read_dir(config.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 2, "only the config and its schema: {leftovers:?}");

    let refused = init(dir.path(), true).unwrap_err();
    assert!(refused.to_string().contains("is a directory"), "{refused}");
}

/// The engine sections' keys in the schema are the ones their parser reads.
#[test]
fn the_engine_keys_in_the_schema_are_the_ones_the_engines_read() {
    use lemon_engines::config::{EngineSections, CLI_KEYS, SHARED_KEYS};
    let document = schema().unwrap();
    let engines = &document["definitions"]["GatewayConfig"]["properties"]["engines"]["properties"];
    let keys = |id: &str| {
        let section = match engines[id].pointer("/allOf/0/$ref").and_then(Value::as_str) {
            Some(reference) => document.pointer(reference.trim_start_matches('#')).unwrap(),
            None => &engines[id],
        };
        let mut keys: Vec<String> =
            section["properties"].as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let mut vendor: Vec<String> = SHARED_KEYS
        .iter()
        .chain(CLI_KEYS.iter())
        .filter(|key| **key != "delay_ms")
        .map(|key| (*key).to_owned())
        .collect();
    vendor.sort();
    for id in ["claude", "codex", "opencode", "pi", "droid"] {
        assert_eq!(keys(id), vendor, "[gateway.engines.{id}]");
    }
    assert_eq!(keys("echo"), ["delay_ms"]);
    // Every key of the native engine's schema is read: a value of the wrong
    // kind (a table) is an error naming it.
    for key in keys("lemon") {
        let text = format!("[gateway.engines.lemon]\n{key} = {{ wrong = 1 }}\n");
        let loaded = lemon_core::config::load_str(&text, Path::new("config.toml")).unwrap();
        let error =
            EngineSections::parse(&loaded.config.gateway.engines, Path::new("config.toml"), &text)
                .expect_err(&key);
        assert!(error.to_string().contains(&key), "{key}: {error}");
    }
    // Every provider the schema offers is one the engine takes.
    for provider in engines["lemon"]["properties"]["provider"]["enum"].as_array().unwrap() {
        let text = format!("[gateway.engines.lemon]\nprovider = {provider}\n");
        assert_eq!(check(&text), Vec::<String>::new(), "{text}");
    }
}

#[test]
fn the_reference_documents_every_table_with_its_keys() {
    let page = reference().unwrap();
    for header in [
        "## `[gateway]`",
        "## `[gateway.engines.claude]`",
        "## `[gateway.engines.lemon]`",
        "## `[gateway.telegram]`",
        "## `[gateway.telegram.files]`",
        "## `[gateway.email.smtp]`",
        "## `[gateway.webhook.integrations.<integration>]`",
        "## `[[gateway.bindings]]`",
        "## `[gateway.budgets.prices.<model>]`",
        "## `[gateway.voice]`",
        "## `[gateway.sms]`",
    ] {
        assert!(page.contains(header), "{header} is missing");
    }
    assert!(
        page.contains("| `max_concurrent_runs` | integer | `2` | 0 to 4096 |"),
        "the README's default and the loader's bound"
    );
    assert!(page.contains("| `token` (reference layout) |"), "telegram's alias");
    let sections = schema::markdown::sections(&schema().unwrap());
    assert!(
        schema::markdown::key_count(&sections) > 300,
        "{}",
        schema::markdown::key_count(&sections)
    );
}

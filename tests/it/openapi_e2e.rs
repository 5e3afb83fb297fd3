//! The OpenAPI document against the real binary: schemathesis (PyPI, pinned)
//! loads `GET /v1/openapi.json` from a gateway with every component that adds
//! routes (SMS, calls) and sends generated requests to every operation, valid
//! and invalid, checking that none is answered with a 5xx, that every status,
//! content type and body is the one the document gives, and that a request
//! without the token is refused. `LEMON_SCHEMATHESIS_EXAMPLES` raises the
//! examples per operation (the CI run uses a few, with a fixed seed).

use std::path::PathBuf;

use lemon_tests::fake_deepgram::FakeDeepgram;
use lemon_tests::fake_elevenlabs::FakeElevenLabs;
use lemon_tests::fake_twilio::FakeTwilio;
use lemon_tests::fake_twilio_voice::{wav_file, FakeTwilioRest};
use serde_json::Value;

use crate::support::{home_with, Gateway, PATIENCE, TOKEN};

/// Keep in step with `schemathesis_version` in scripts/test.
const SCHEMATHESIS_VERSION: &str = "4.32.5";
const ACCOUNT_SID: &str = "AC0123456789abcdef0123456789abcdef";
const AUTH_TOKEN: &str = "twilio-openapi-auth-token-7c1d";
const DEEPGRAM_KEY: &str = "deepgram-openapi-key";
const ELEVENLABS_KEY: &str = "elevenlabs-openapi-key";
/// Operations left out of the generated requests: pausing intake holds every
/// later run (`?wait=true` and the OpenAI routes would wait for a resume
/// that never comes; `intake_e2e` covers it), and the firehose is a stream
/// that never ends (`gateway_e2e` covers it).
const EXCLUDED: &[&str] = &["/v1/intake/pause", "/v1/events"];
/// Examples per operation in the CI run.
const DEFAULT_EXAMPLES: u32 = 8;

/// `schemathesis` from the virtual environment scripts/test makes, or
/// `LEMON_SCHEMATHESIS`. `None` only when there is no Python at all.
fn schemathesis() -> Option<PathBuf> {
    crate::support::cached_python_tool(
        "LEMON_SCHEMATHESIS",
        &format!("schemathesis-{SCHEMATHESIS_VERSION}/bin/schemathesis"),
        "schemathesis",
    )
}

/// A gateway with the echo engine, SMS (to a fake Twilio) and voice (with
/// fake Deepgram, ElevenLabs and Twilio REST), so the document has every route.
async fn start() -> (Gateway, tempfile::TempDir, FakeTwilio, impl Sized) {
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    let deepgram = FakeDeepgram::start(DEEPGRAM_KEY).await;
    let elevenlabs = FakeElevenLabs::start(ELEVENLABS_KEY).await;
    let rest = FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN, wav_file(800), 0).await;
    let config = format!(
        "[gateway]\ndefault_engine = \"echo\"\n\
         [gateway.engines.echo]\ndelay_ms = 0\n\
         [gateway.sms]\nenabled = true\nport = 0\npublic_url = \"https://sms.example.test\"\n\
         inbox_number = \"+15551239999\"\napi_base_url = \"{}\"\n\
         [gateway.voice]\nenabled = true\nport = 0\npublic_url = \"https://voice.example.test\"\n\
         engine = \"echo\"\ngreeting = \"\"\ndeepgram_base_url = \"{}\"\n\
         elevenlabs_base_url = \"{}\"\ntwilio_api_base_url = \"{}\"\n",
        twilio.url(),
        deepgram.base_url,
        elevenlabs.base_url,
        rest.base_url
    );
    let home = home_with(&config);
    let secrets = home.path().join("secrets.toml");
    std::fs::write(
        &secrets,
        format!(
            "twilio_auth_token = \"{AUTH_TOKEN}\"\ntwilio_account_sid = \"{ACCOUNT_SID}\"\n\
             deepgram_api_key = \"{DEEPGRAM_KEY}\"\nelevenlabs_api_key = \"{ELEVENLABS_KEY}\"\n"
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let gateway = Gateway::start_in(home.path()).await;
    (gateway, home, twilio, (deepgram, elevenlabs, rest))
}

#[tokio::test]
async fn the_document_lists_the_components_routes_behind_the_token() {
    let (gateway, _home, _twilio, _fakes) = start().await;
    let refused = gateway.http.get(format!("{}/v1/openapi.json", gateway.api)).send().await;
    assert_eq!(refused.unwrap().status(), 401);
    let doc: Value = gateway.get("/v1/openapi.json").send().await.unwrap().json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "/v1/runs",
        "/v1/chat/completions",
        "/v1/secrets/{name}",
        "/v1/sms/send",
        "/v1/sms/messages/{sid}/claim",
        "/v1/calls/{id}",
        "/v1/openapi.json",
    ] {
        assert!(paths.contains_key(path), "{path} is missing: {:?}", paths.keys());
    }
}

#[tokio::test]
async fn schemathesis_finds_no_5xx_and_no_response_off_its_schema() {
    let Some(schemathesis) = schemathesis() else {
        lemon_tests::host::lacks("LEMON_REQUIRE_PYTHON", "Python 3 with a venv for schemathesis");
        return;
    };
    let examples = std::env::var("LEMON_SCHEMATHESIS_EXAMPLES")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(DEFAULT_EXAMPLES);
    let (gateway, home, _twilio, _fakes) = start().await;
    let report = home.path().join("schemathesis-report");
    let mut command = tokio::process::Command::new(&schemathesis);
    command
        .arg("run")
        .arg(format!("{}/v1/openapi.json", gateway.api))
        .arg("--url")
        .arg(&gateway.api)
        .arg("--header")
        .arg(format!("Authorization: Bearer {TOKEN}"))
        .arg("--checks")
        .arg(
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_schema_conformance,ignored_auth",
        )
        .arg("--phases")
        .arg("examples,coverage,fuzzing")
        .arg("--max-examples")
        .arg(examples.to_string())
        .arg("--seed")
        .arg("16")
        .arg("--workers")
        .arg("1")
        .arg("--request-timeout")
        .arg("30")
        .arg("--report")
        .arg("junit")
        .arg("--report-dir")
        .arg(&report)
        .arg("--no-color")
        .env("HOME", home.path())
        .kill_on_drop(true);
    for path in EXCLUDED {
        command.arg("--exclude-path").arg(path);
    }
    let output = tokio::time::timeout(PATIENCE * 5, command.output())
        .await
        .expect("schemathesis finishes in time")
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{stdout}\n--- stderr ---\n{stderr}"
    );
    // Every operation of the document was exercised, none skipped or errored.
    assert!(stdout.contains("Tested: 40"), "40 operations tested:\n{stdout}");
    #[allow(clippy::print_stderr)] // The figures RELIABILITY.md quotes.
    {
        let summary: Vec<&str> =
            stdout.lines().skip_while(|line| !line.contains("SUMMARY")).collect();
        eprintln!("schemathesis, {examples} examples per operation:\n{}", summary.join("\n"));
    }
}

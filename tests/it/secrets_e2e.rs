//! `secrets` and `doctor` on the real binary; `/v1/secrets` on a running
//! gateway and a changed secret reaching Telegram without a restart; the
//! real Secret Service (gnome-keyring under `dbus-run-session`, no display)
//! for `secrets migrate`; a keychain that never answers bounded by the probe;
//! the kernel keyutils under `keyctl session -` with no session bus.

use std::path::Path;
use std::process::{Output, Stdio};

use lemon_tests::fake_telegram::FakeTelegram;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::support::{command, home_with, write_config, Gateway, PATIENCE, TOKEN};

const SECRET_VALUE: &str = "123456:very-secret-value-xyz";

/// The binary on `home` with `args`, `stdin` written to it; its output.
async fn run_with(mut cmd: Command, args: &[&str], stdin: &str) -> Output {
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    tokio::time::timeout(PATIENCE, child.wait_with_output()).await.expect("exits in time").unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Writes `secrets.toml` of `home` with mode 0600, as `secrets set` does.
fn write_secrets(home: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn no_value_in(output: &Output) {
    let all = text(output);
    assert!(!all.contains(SECRET_VALUE) && !all.contains("very-secret"), "a value leaked: {all}");
}

#[tokio::test]
async fn set_list_and_delete_through_the_secrets_file_never_show_the_value() {
    let home = home_with("[gateway.telegram]\nbot_token_secret = \"telegram_bot_token\"\n");
    let set = run_with(
        command(home.path()),
        &["secrets", "set", "telegram_bot_token"],
        &format!("{SECRET_VALUE}\n"),
    )
    .await;
    assert!(set.status.success(), "{}", text(&set));
    assert!(text(&set).contains("telegram_bot_token: saved to the file"), "{}", text(&set));
    no_value_in(&set);
    let file = home.path().join("secrets.toml");
    assert!(std::fs::read_to_string(&file).unwrap().contains(SECRET_VALUE));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);

    let list = run_with(command(home.path()), &["secrets", "list"], "").await;
    assert!(list.status.success(), "{}", text(&list));
    let listed = text(&list);
    assert!(listed.contains("keychain: not available (switched off"), "{listed}");
    let line = listed
        .lines()
        .find(|l| l.starts_with("telegram_bot_token"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(line.contains("file (") && line.contains("(used by telegram)"), "{line}");
    assert!(
        listed.lines().any(|l| l.starts_with("lemon_api_token") && l.contains("environment")),
        "{listed}"
    );
    no_value_in(&list);

    let json = run_with(command(home.path()), &["secrets", "list", "--json"], "").await;
    let body: Value = serde_json::from_slice(&json.stdout).unwrap();
    let row =
        body["secrets"].as_array().unwrap().iter().find(|r| r["name"] == "telegram_bot_token");
    assert_eq!(
        row,
        Some(&json!({"name": "telegram_bot_token", "source": "file", "used_by": ["telegram"]}))
    );
    assert_eq!(body["keychain"]["available"], json!(false));

    let bad = run_with(command(home.path()), &["secrets", "set", "Bad-Name"], "x\n").await;
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).contains("invalid secret name"), "{}", text(&bad));
    let empty = run_with(command(home.path()), &["secrets", "set", "other"], "\n").await;
    assert_eq!(empty.status.code(), Some(2), "{}", text(&empty));

    let delete =
        run_with(command(home.path()), &["secrets", "delete", "telegram_bot_token"], "").await;
    assert!(delete.status.success(), "{}", text(&delete));
    assert!(!std::fs::read_to_string(&file).unwrap().contains("telegram_bot_token"));
    let again =
        run_with(command(home.path()), &["secrets", "delete", "telegram_bot_token"], "").await;
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    let list = run_with(command(home.path()), &["secrets", "list"], "").await;
    let line = text(&list);
    assert!(
        line.lines().any(|l| l.starts_with("telegram_bot_token") && l.contains("not set")),
        "{line}"
    );
    let migrate = run_with(command(home.path()), &["secrets", "migrate"], "").await;
    assert_eq!(migrate.status.code(), Some(1), "{}", text(&migrate));
    assert!(text(&migrate).contains("no keychain"), "{}", text(&migrate));
}

/// Whether the Secret Service test can run here (scripts/test installs both).
fn have_secret_service() -> bool {
    ["dbus-run-session", "gnome-keyring-daemon"].iter().all(|tool| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The binary run inside its own D-Bus session with an unlocked
/// gnome-keyring (password `pw`), no display, `HOME` = `home` (where the
/// keyring file is kept from one session to the next).
fn in_keyring_session(home: &Path) -> Command {
    // The unlocked daemon must own the bus name before the gateway asks for it,
    // or D-Bus starts a second, locked one (bounded: 10 s).
    let script = "echo -n pw | gnome-keyring-daemon --unlock --components=secrets >/dev/null 2>&1
        i=0
        until dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
            org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null | grep -q true; do
            i=$((i+1)); [ $i -gt 100 ] && { echo 'gnome-keyring did not start' >&2; exit 1; }
            sleep 0.1
        done
        exec \"$@\"";
    let mut cmd = Command::new("dbus-run-session");
    cmd.arg("--")
        .arg("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(crate::support::gateway_bin())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("LEMON_HOME", home)
        .env("LEMON_LOG", "warn")
        .env("LEMON_KEYCHAIN", "secret-service")
        .env("LEMON_KEYCHAIN_TIMEOUT_MS", "10000")
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn migrate_moves_the_file_into_the_secret_service() {
    assert!(
        have_secret_service(),
        "dbus-run-session and gnome-keyring-daemon are needed (scripts/test installs them)"
    );
    let home = home_with("");
    write_secrets(home.path(), &format!("openai_api_key = \"{SECRET_VALUE}\"\n"));
    let migrate = run_with(in_keyring_session(home.path()), &["secrets", "migrate"], "").await;
    assert!(migrate.status.success(), "{}", text(&migrate));
    assert!(text(&migrate).contains("openai_api_key: moved to the keychain"), "{}", text(&migrate));
    no_value_in(&migrate);
    let file = std::fs::read_to_string(home.path().join("secrets.toml")).unwrap();
    assert!(!file.contains("openai_api_key"), "{file}");

    // A new session (a new keyring daemon) reads it from the keyring file.
    let list = run_with(in_keyring_session(home.path()), &["secrets", "list"], "").await;
    let listed = text(&list);
    assert!(listed.contains("keychain: Secret Service"), "{listed}");
    assert!(
        listed.lines().any(|l| l.starts_with("openai_api_key") && l.contains("keychain")),
        "{listed}"
    );
    no_value_in(&list);

    let set =
        run_with(in_keyring_session(home.path()), &["secrets", "set", "tg_token"], "1:two\n").await;
    assert!(text(&set).contains("tg_token: saved to the keychain"), "{}", text(&set));
    let delete =
        run_with(in_keyring_session(home.path()), &["secrets", "delete", "openai_api_key"], "")
            .await;
    assert!(delete.status.success(), "{}", text(&delete));
    let list = run_with(in_keyring_session(home.path()), &["secrets", "list", "--json"], "").await;
    let body: Value =
        serde_json::from_slice(&list.stdout).unwrap_or_else(|_| panic!("{}", text(&list)));
    let source = |name: &str| {
        let rows = body["secrets"].as_array().unwrap();
        rows.iter().find(|r| r["name"] == name).map(|r| r["source"].clone())
    };
    assert_eq!(source("tg_token"), Some(json!("keychain")), "{body}");
    assert_eq!(source("openai_api_key"), Some(Value::Null), "deleted, still named: {body}");
}

/// A socket that accepts D-Bus connections and never answers: a keychain
/// that hangs, like a locked keyring waiting for its password prompt.
fn silent_bus(dir: &Path) -> (String, std::os::unix::net::UnixListener) {
    let path = dir.join("silent-bus");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    (format!("unix:path={}", path.display()), listener)
}

#[tokio::test]
async fn a_keychain_that_never_answers_does_not_hang_secrets_list_or_the_start() {
    let home = home_with("");
    let bus_dir = tempfile::tempdir().unwrap();
    let (address, _listener) = silent_bus(bus_dir.path());
    let hanging = |mut cmd: Command| {
        cmd.env("LEMON_KEYCHAIN", "secret-service")
            .env("LEMON_KEYCHAIN_TIMEOUT_MS", "300")
            .env("DBUS_SESSION_BUS_ADDRESS", &address);
        cmd
    };
    let list = run_with(hanging(command(home.path())), &["secrets", "list"], "").await;
    assert!(list.status.success(), "{}", text(&list));
    assert!(text(&list).contains("no answer within 300 ms"), "{}", text(&list));

    let gateway = Gateway::spawn(hanging(command(home.path())), home.path()).await;
    let listed: Value = gateway.get("/v1/secrets").send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["keychain"]["available"], json!(false), "{listed}");
    assert!(listed["keychain"]["detail"].as_str().unwrap().contains("no answer"), "{listed}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_secret_set_through_the_api_reaches_telegram_without_a_restart() {
    let (old, new) = ("111:old-token", "222:new-token");
    let fake = FakeTelegram::start(&[(old, 111, "old_bot"), (new, 222, "new_bot")]).await;
    let home = home_with(&format!(
        "[gateway]\nenable_telegram = true\n[gateway.telegram]\nbot_token_secret = \"telegram_bot_token\"\napi_base_url = \"{}\"\npoll_timeout_s = 1\n",
        fake.base_url()
    ));
    write_secrets(home.path(), &format!("telegram_bot_token = \"{old}\"\n"));
    let gateway = Gateway::start_in(home.path()).await;
    fake.wait_until("the old bot polls", PATIENCE, |s| {
        s.calls().iter().any(|c| c.bot_id == Some(111) && c.method == "getUpdates")
    })
    .await;

    let response = gateway
        .http
        .put(format!("{}/v1/secrets/telegram_bot_token", gateway.api))
        .bearer_auth(TOKEN)
        .json(&json!({"value": new}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!({"name": "telegram_bot_token", "source": "file"}));
    fake.wait_until("the new bot starts", PATIENCE, |s| {
        s.calls().iter().any(|c| c.bot_id == Some(222) && c.method == "getMe")
    })
    .await;

    let listed: Value = gateway.get("/v1/secrets").send().await.unwrap().json().await.unwrap();
    let row =
        listed["secrets"].as_array().unwrap().iter().find(|r| r["name"] == "telegram_bot_token");
    assert_eq!(
        row,
        Some(&json!({"name": "telegram_bot_token", "source": "file", "used_by": ["telegram"]}))
    );
    assert!(!listed.to_string().contains("new-token"), "{listed}");
    let bad = gateway
        .http
        .put(format!("{}/v1/secrets/Bad.Name", gateway.api))
        .bearer_auth(TOKEN)
        .json(&json!({"value": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    gateway.terminate().await;
}

fn doctor_command(home: &Path) -> Command {
    let mut cmd = command(home);
    cmd.env("LEMON_KEYCHAIN", "mock").env("OPENAI_API_KEY", "sk-test").env("NO_COLOR", "1");
    cmd
}

#[tokio::test]
async fn doctor_passes_a_good_config_and_fails_what_would_stop_a_start() {
    let fake = FakeTelegram::start(&[("123:good", 123, "lemon_bot")]).await;
    let home = home_with("");
    let good = format!(
        "[gateway]\nenable_telegram = true\n[gateway.telegram]\nbot_token_secret = \"telegram_bot_token\"\napi_base_url = \"{}\"\n[gateway.api]\nport = 0\n[gateway.health]\nport = 0\n",
        fake.base_url()
    );
    write_config(home.path(), &good);
    write_secrets(home.path(), "telegram_bot_token = \"123:good\"\n");
    let ok = run_with(doctor_command(home.path()), &["doctor"], "").await;
    let report = text(&ok);
    assert!(ok.status.success(), "{report}");
    assert!(!report.contains("fail "), "{report}");
    for line in ["ok    config", "ok    keychain", "ok    control API", "ok    provider key"] {
        assert!(report.contains(line), "{line:?} in {report}");
    }
    assert!(report.contains("the bot token is accepted (@lemon_bot)"), "{report}");

    // Telegram refuses the token: getMe answers 401.
    write_secrets(home.path(), "telegram_bot_token = \"999:wrong\"\n");
    let refused = run_with(doctor_command(home.path()), &["doctor"], "").await;
    let report = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{report}");
    assert!(report.contains("fail  channel telegram") && report.contains("401"), "{report}");
    assert!(report.contains("lemon-gateway secrets set telegram_bot_token"), "{report}");
    assert!(!report.contains("999:wrong"), "the token is not shown: {report}");

    // A port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    write_config(
        home.path(),
        &format!("[gateway.api]\nport = {port}\n[gateway.health]\nport = 0\n"),
    );
    let busy = run_with(doctor_command(home.path()), &["doctor"], "").await;
    let report = text(&busy);
    assert_eq!(busy.status.code(), Some(1), "{report}");
    assert!(
        report.contains("fail  control API") && report.contains(&format!("127.0.0.1:{port}")),
        "{report}"
    );

    // A broken config: file:line:col.
    std::fs::write(home.path().join("config.toml"), "[gateway]\nmax_concurrent_runs = \"many\"\n")
        .unwrap();
    let broken = run_with(doctor_command(home.path()), &["doctor"], "").await;
    let report = text(&broken);
    assert_eq!(broken.status.code(), Some(1), "{report}");
    let config = home.path().join("config.toml");
    assert!(
        report.contains("fail  config") && report.contains(&format!("{}:2:", config.display())),
        "{report}"
    );
    drop(taken);
}

/// The binary's `script` (a `sh -c` text; `$B` is the binary) run in a new
/// kernel session keyring (`keyctl session -`), with no session bus and no
/// display, so `auto` finds no Secret Service and uses keyutils.
fn in_keyutils_session(home: &Path, script: &str) -> Command {
    let mut cmd = Command::new("keyctl");
    cmd.args(["session", "-", "sh", "-c", script])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("B", crate::support::gateway_bin())
        .env("HOME", home)
        .env("LEMON_HOME", home)
        .env("LEMON_LOG", "warn")
        .env("LEMON_API_TOKEN", TOKEN)
        .env("LEMON_KEYCHAIN", "auto")
        .env("DBUS_SESSION_BUS_ADDRESS", "disabled:")
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn keyutils_keeps_a_secret_that_a_second_process_in_the_session_serves() {
    let keyctl_present = std::process::Command::new("sh")
        .args(["-c", "command -v keyctl"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !keyctl_present {
        let need = "keyctl (scripts/test installs keyutils)";
        lemon_tests::host::lacks("LEMON_REQUIRE_KEYCTL", need);
        return;
    }
    // Keys linked to the user's persistent keyring outlive the session, so
    // the name is this run's own, and it is deleted at the end.
    let name = format!("tg_keyutils_{}", std::process::id());
    let bot_token = "333:keyutils-token-abc";
    let fake = FakeTelegram::start(&[(bot_token, 333, "keyutils_bot")]).await;
    let home = home_with(&format!(
        "[gateway]\nenable_telegram = true\n[gateway.telegram]\nbot_token_secret = \"{name}\"\napi_base_url = \"{}\"\npoll_timeout_s = 1\n",
        fake.base_url()
    ));
    // Set, list, look with keyctl, then start the gateway in the same session.
    let script = format!(
        "printf '%s\\n' \"$SECRET\" | \"$B\" secrets set {name} > set.txt 2>&1 || exit 1
         \"$B\" secrets list > list.txt 2>&1 || exit 1
         keyctl search @s user 'keyring-rs:{name}@lemon-gateway' > keyctl.txt 2>&1 || exit 1
         exec \"$B\""
    );
    let mut cmd = in_keyutils_session(home.path(), &script);
    cmd.current_dir(home.path()).env("SECRET", bot_token);
    let gateway = Gateway::spawn(cmd, home.path()).await;
    let read = |file: &str| std::fs::read_to_string(home.path().join(file)).unwrap();
    assert!(
        read("set.txt").contains(&format!("{name}: saved to the keychain")),
        "{}",
        read("set.txt")
    );
    let list = read("list.txt");
    assert!(list.contains("keychain: kernel keyutils"), "{list}");
    let row = list.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or_default();
    assert_eq!(row.split_whitespace().nth(1), Some("keychain"), "{list}");
    assert!(read("keyctl.txt").trim().parse::<u64>().is_ok(), "keyctl: {}", read("keyctl.txt"));
    for file in ["set.txt", "list.txt"] {
        assert!(!read(file).contains(bot_token), "{file}: {}", read(file));
    }
    // The gateway read the token from keyutils: its bot introduces itself.
    fake.wait_until("the bot from keyutils", PATIENCE, |s| {
        s.calls().iter().any(|c| c.bot_id == Some(333) && c.method == "getMe")
    })
    .await;
    let listed: Value = gateway.get("/v1/secrets").send().await.unwrap().json().await.unwrap();
    let source = listed["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name.as_str())
        .map(|row| row["source"].clone());
    assert_eq!(source, Some(json!("keychain")), "{listed}");
    gateway.terminate().await;

    // Deleted from keyutils, from a session of its own.
    let script = format!(
        "\"$B\" secrets delete {name} || exit 1
         if keyctl search @s user 'keyring-rs:{name}@lemon-gateway' >/dev/null 2>&1; then echo still there; exit 1; fi
         \"$B\" secrets list"
    );
    let output = in_keyutils_session(home.path(), &script).output();
    let output = tokio::time::timeout(PATIENCE, output).await.expect("exits in time").unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let listed = text(&output);
    assert!(listed.contains(&format!("{name}: deleted")), "{listed}");
    let row = listed.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or_default();
    assert!(row.contains("not set"), "{listed}");
}

//! `telegram_send_image` and `discord_send_file`: which sessions get them,
//! every message, path resolution and containment.

use std::sync::Arc;

use lemon_core::ids::SessionKey;
use lemon_core::tool::{Tool, ToolOutput};
use serde_json::{json, Value};

use super::super::testutil::Dirs;
use super::super::{gateway_tools, GatewayToolOptions};

const TELEGRAM: &str = "agent:main:telegram:9:dm:42";
const DISCORD: &str = "agent:main:discord:default:channel:1234";

fn tool(name: &str, options: &GatewayToolOptions) -> Arc<dyn Tool> {
    gateway_tools(options).into_iter().find(|tool| tool.spec().name == name).unwrap()
}

async fn send(dirs: &Dirs, name: &str, session: &str, args: Value) -> ToolOutput {
    tool(name, &GatewayToolOptions::default()).execute(args, dirs.ctx_for(session)).await
}

#[test]
fn each_tool_is_offered_only_to_its_channels_sessions() {
    let options = GatewayToolOptions::default();
    let telegram = tool("telegram_send_image", &options);
    let discord = tool("discord_send_file", &options);
    for key in [TELEGRAM, "agent:main:telegram:9:group:-1005:thread:77"] {
        assert!(telegram.offered(&SessionKey::from(key)), "{key}");
        assert!(!discord.offered(&SessionKey::from(key)), "{key}");
    }
    assert!(discord.offered(&SessionKey::from(DISCORD)));
    assert!(!telegram.offered(&SessionKey::from(DISCORD)));
    for key in ["agent:main:main", "telegram", "agent:main:telegram", "api:telegram:1:dm:2:3", ""] {
        assert!(!telegram.offered(&SessionKey::from(key)), "{key}");
        assert!(!discord.offered(&SessionKey::from(key)), "{key}");
    }
}

#[tokio::test]
async fn an_image_in_the_cwd_is_queued_for_telegram_with_its_caption() {
    let dirs = Dirs::new();
    std::fs::write(dirs.cwd.join("chart.png"), b"png").unwrap();
    let out = send(
        &dirs,
        "telegram_send_image",
        TELEGRAM,
        json!({"path": "chart.png", "caption": " Latest chart "}),
    )
    .await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.text, "Queued image for Telegram delivery: chart.png");
    let path = dirs.cwd.canonicalize().unwrap().join("chart.png");
    assert_eq!(
        out.details,
        json!({"auto_send_files": [{"path": path.display().to_string(), "filename": "chart.png", "caption": "Latest chart"}]})
    );
    let blank =
        send(&dirs, "telegram_send_image", TELEGRAM, json!({"path": "chart.png", "caption": "  "}))
            .await;
    assert_eq!(blank.details["auto_send_files"][0]["caption"], Value::Null);
}

#[tokio::test]
async fn telegram_paths_resolve_through_the_workspace_and_absolute_paths_inside_are_accepted() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.workspace.join("images")).unwrap();
    std::fs::write(dirs.workspace.join("images/plot.png"), b"png").unwrap();
    std::fs::write(dirs.workspace.join("only_here.JPG"), b"jpg").unwrap();
    let ws = dirs.workspace.canonicalize().unwrap();
    for (raw, expected) in [
        ("workspace/images/plot.png", ws.join("images/plot.png")),
        ("./workspace/images/plot.png", ws.join("images/plot.png")),
        (".lemon/agent/workspace/images/plot.png", ws.join("images/plot.png")),
        ("only_here.JPG", ws.join("only_here.JPG")),
    ] {
        let out = send(&dirs, "telegram_send_image", TELEGRAM, json!({"path": raw})).await;
        assert!(!out.is_error, "{raw}: {out:?}");
        assert_eq!(
            out.details["auto_send_files"][0]["path"],
            expected.display().to_string(),
            "{raw}"
        );
    }
    std::fs::write(dirs.cwd.join("abs.webp"), b"webp").unwrap();
    let absolute = dirs.cwd.join("abs.webp").display().to_string();
    let out = send(&dirs, "telegram_send_image", TELEGRAM, json!({"path": absolute})).await;
    assert_eq!(out.text, "Queued image for Telegram delivery: abs.webp");
}

#[tokio::test]
async fn telegram_refusals_have_their_texts() {
    let dirs = Dirs::new();
    std::fs::write(dirs.cwd.join("notes.txt"), b"text").unwrap();
    let main =
        send(&dirs, "telegram_send_image", "agent:main:main", json!({"path": "notes.txt"})).await;
    assert!(main.is_error);
    assert_eq!(main.text, "telegram_send_image is only available for Telegram channel sessions.");
    assert_eq!(main.details["error"], true);
    let kind = send(&dirs, "telegram_send_image", TELEGRAM, json!({"path": "notes.txt"})).await;
    assert_eq!(kind.text, "Unsupported image type for telegram_send_image: .txt");
    let missing = send(&dirs, "telegram_send_image", TELEGRAM, json!({"path": "nope.png"})).await;
    assert_eq!(missing.text, "Image not found: nope.png");
    let caption =
        send(&dirs, "telegram_send_image", TELEGRAM, json!({"path": "x.png", "caption": 3})).await;
    assert_eq!(caption.text, "caption must be a string");
    let no_path = send(&dirs, "telegram_send_image", TELEGRAM, json!({})).await;
    assert_eq!(no_path.text, "Missing required parameter: path");

    std::fs::write(dirs.cwd.join("big.png"), vec![0u8; 2048]).unwrap();
    let small = GatewayToolOptions { telegram_max_bytes: 1024, ..GatewayToolOptions::default() };
    let big = tool("telegram_send_image", &small)
        .execute(json!({"path": "big.png"}), dirs.ctx_for(TELEGRAM))
        .await;
    assert_eq!(big.text, "big.png is 2048 bytes, over the 1024-byte limit of telegram");
}

#[tokio::test]
async fn discord_files_any_type_with_a_filename_override() {
    let dirs = Dirs::new();
    std::fs::write(dirs.cwd.join("report.txt"), b"report").unwrap();
    let out = send(
        &dirs,
        "discord_send_file",
        DISCORD,
        json!({"path": "report.txt", "caption": "artifact"}),
    )
    .await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.text, "Queued file for Discord delivery: report.txt");
    let files = &out.details["auto_send_files"][0];
    assert_eq!(
        (files["filename"].clone(), files["caption"].clone()),
        (json!("report.txt"), json!("artifact"))
    );

    std::fs::write(dirs.workspace.join("w.txt"), b"w").unwrap();
    let renamed = send(
        &dirs,
        "discord_send_file",
        DISCORD,
        json!({"path": "w.txt", "filename": "delivered.txt"}),
    )
    .await;
    assert_eq!(renamed.text, "Queued file for Discord delivery: delivered.txt");
    let path = dirs.workspace.canonicalize().unwrap().join("w.txt");
    assert_eq!(renamed.details["auto_send_files"][0]["path"], path.display().to_string());

    let main = send(&dirs, "discord_send_file", TELEGRAM, json!({"path": "report.txt"})).await;
    assert_eq!(main.text, "discord_send_file is only available for Discord channel sessions.");
    let missing = send(&dirs, "discord_send_file", DISCORD, json!({"path": "gone.bin"})).await;
    assert_eq!(missing.text, "File not found: gone.bin");
}

#[tokio::test]
async fn both_send_tools_refuse_files_out_of_the_cwd_and_workspace() {
    let dirs = Dirs::new();
    dirs.plant_links();
    std::fs::write(dirs.outside.join("photo.png"), b"png").unwrap();
    std::os::unix::fs::symlink(dirs.outside.join("photo.png"), dirs.cwd.join("photo_link.png"))
        .unwrap();
    let home =
        GatewayToolOptions { home: Some(dirs.outside.clone()), ..GatewayToolOptions::default() };
    let mut attacks = dirs.attacks();
    attacks.extend([
        "../outside/photo.png".to_owned(),
        dirs.outside.join("photo.png").display().to_string(),
        "photo_link.png".to_owned(),
        "link_out/photo.png".to_owned(),
        "~/photo.png".to_owned(),
        "workspace/../../outside/photo.png".to_owned(),
    ]);
    for (name, session) in [("telegram_send_image", TELEGRAM), ("discord_send_file", DISCORD)] {
        for attack in &attacks {
            let out =
                tool(name, &home).execute(json!({"path": attack}), dirs.ctx_for(session)).await;
            assert!(out.is_error, "{name} {attack}: {out:?}");
            assert!(out.details.get("auto_send_files").is_none(), "{name} {attack}");
        }
        let out =
            tool(name, &home).execute(json!({"path": "/etc/passwd"}), dirs.ctx_for(session)).await;
        assert_eq!(
            out.text,
            "/etc/passwd is outside the working directory and the workspace; only files there can be sent"
        );
    }
}

//! `sms_send` refuses what the config does not allow before anything is sent.

use lemon_core::ids::RunId;
use tokio_util::sync::CancellationToken;

use super::*;

fn ctx() -> ToolContext {
    ToolContext {
        run_id: RunId::parse("run_test").unwrap(),
        session_key: "agent:main".into(),
        call_id: "call_1".into(),
        cwd: std::env::temp_dir(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        cancel: CancellationToken::new(),
    }
}

fn config(text: &str) -> Arc<SmsConfig> {
    Arc::new(SmsConfig::parse(&text.parse().unwrap()).unwrap())
}

#[tokio::test]
async fn without_credentials_the_tool_says_sending_is_not_configured() {
    let tool = SendTool::new(config(""), None);
    let out = tool.execute(json!({"to": "+15550001111", "body": "hi"}), ctx()).await;
    assert!(out.is_error);
    assert!(out.text.contains("not configured"), "{}", out.text);
}

#[tokio::test]
async fn only_allowed_numbers_are_texted_and_arguments_are_checked() {
    let tracker = tokio_util::task::TaskTracker::new();
    let client = crate::send::TwilioClient::new(
        "http://127.0.0.1:1",
        "AC1".into(),
        "t".into(),
        "+15551239999".into(),
    );
    let sender = SmsSender::spawn(
        client,
        lemon_core::store::StoreHandle::memory(),
        std::time::Duration::from_secs(60),
        CancellationToken::new(),
        &tracker,
    );
    let tool = SendTool::new(config("allowed_senders = [\"+15550001111\"]"), Some(sender));
    assert_eq!(tool.spec().name, "sms_send");
    let out = tool.execute(json!({"to": "+15550002222", "body": "hi"}), ctx()).await;
    assert!(out.is_error);
    assert_eq!(
        out.text,
        "+15550002222 is not a number this gateway may text; allowed: +15550001111"
    );
    let out = tool.execute(json!({"to": "+15550001111"}), ctx()).await;
    assert_eq!(out.text, "Missing required parameter: body");
    let out = tool.execute(json!({"to": 5, "body": "x"}), ctx()).await;
    assert_eq!(out.text, "to must be a string");
    let none = SendTool::new(config(""), None);
    assert!(none.execute(json!({}), ctx()).await.is_error);
    let nobody = SendTool::new(config(""), Some(tool.sender.clone().unwrap()));
    let out = nobody.execute(json!({"to": "+15550001111", "body": "x"}), ctx()).await;
    assert!(out.text.contains("allowed: none"), "{}", out.text);
}

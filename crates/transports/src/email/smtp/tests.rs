//! The reply mail's headers from `[gateway.email.smtp]`.

use super::*;

fn sender(extra: &str) -> SmtpSender {
    let table: toml::Table = format!("host = \"smtp.example.test\"\n{extra}").parse().unwrap();
    let config: SmtpConfig = table.try_into().unwrap();
    SmtpSender::new(&config, None, "Lemon <lemon@example.test>").unwrap()
}

fn mail() -> OutgoingMail {
    OutgoingMail {
        to: "alice@example.test".to_owned(),
        subject: "Re: hi".to_owned(),
        message_id: "m1@example.test".to_owned(),
        in_reply_to: None,
        references: Vec::new(),
        text: "hello".to_owned(),
    }
}

fn headers(sender: &SmtpSender) -> String {
    let formatted = sender.build(&mail()).unwrap().formatted();
    let text = String::from_utf8_lossy(&formatted).into_owned();
    text.split("\r\n\r\n").next().unwrap_or_default().to_owned()
}

#[test]
fn the_reference_reply_to_is_the_answers_reply_to_header() {
    let with = headers(&sender("reply_to = \"Desk <desk@example.test>\""));
    assert!(with.contains("Reply-To: Desk <desk@example.test>"), "{with}");
    let without = headers(&sender(""));
    assert!(!without.contains("Reply-To"), "{without}");
}

#[test]
fn a_reply_to_that_is_no_address_is_refused_naming_the_key() {
    let table: toml::Table = "host = \"smtp.example.test\"\nreply_to = \"nobody\"".parse().unwrap();
    let config: SmtpConfig = table.try_into().unwrap();
    let error = SmtpSender::new(&config, None, "lemon@example.test").unwrap_err();
    assert!(error.contains("`smtp.reply_to`"), "{error}");
}

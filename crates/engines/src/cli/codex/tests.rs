//! Tests of Codex's reconnect notes, statuses and command titles.

use super::*;

#[test]
fn reconnect_messages_give_attempt_and_max() {
    assert_eq!(reconnect_attempt("Reconnecting... 1/5"), Some((1, 5)));
    assert_eq!(reconnect_attempt("Reconnecting (attempt 12/20) after error"), Some((12, 20)));
    assert_eq!(reconnect_attempt("Reconnecting in 3s... 2x 4/5"), Some((4, 5)));
    assert_eq!(reconnect_attempt("stream error 1/5"), None);
    assert_eq!(reconnect_attempt("Reconnecting..."), None);
}

#[test]
fn unknown_statuses_count_as_in_progress() {
    assert_eq!(status_name(Some("completed")), "completed");
    assert_eq!(status_name(Some("declined")), "declined");
    assert_eq!(status_name(Some("unknown_status")), "in_progress");
    assert_eq!(status_name(None), "in_progress");
}

#[test]
fn the_home_directory_reads_as_a_tilde_in_command_titles() {
    let parser =
        Parser::new(ParseContext { home: Some("/home/me".to_owned()), ..ParseContext::default() });
    assert_eq!(parser.command_title("cat /home/me/notes.txt"), "cat ~/notes.txt");
    let rootless =
        Parser::new(ParseContext { home: Some("/".to_owned()), ..ParseContext::default() });
    assert_eq!(rootless.command_title("ls /tmp"), "ls /tmp");
}

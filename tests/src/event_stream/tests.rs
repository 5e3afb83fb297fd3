//! The event-stream reader against the WHATWG rules, each stream read whole,
//! byte by byte and cut at every point.

use std::time::Duration;

use super::{Event, EventStream};

fn event(event: &str, data: &str, id: &str) -> Event {
    Event { event: event.to_owned(), data: data.to_owned(), id: id.to_owned() }
}

/// Reads `stream` whole, one byte at a time and in two pieces cut at every
/// point; each reading must give `expected`.
fn check(stream: &[u8], expected: &[Event]) {
    let mut whole = EventStream::default();
    assert_eq!(whole.push(stream), expected, "whole: {:?}", String::from_utf8_lossy(stream));
    let mut bytewise = EventStream::default();
    let events: Vec<Event> = stream.iter().flat_map(|byte| bytewise.push(&[*byte])).collect();
    assert_eq!(events, expected, "byte by byte: {:?}", String::from_utf8_lossy(stream));
    for cut in 0..=stream.len() {
        let mut split = EventStream::default();
        let mut events = split.push(&stream[..cut]);
        events.extend(split.push(&stream[cut..]));
        assert_eq!(events, expected, "cut at {cut}: {:?}", String::from_utf8_lossy(stream));
    }
}

#[test]
fn a_blank_line_dispatches_the_event_with_its_type_and_data() {
    check(
        b"event: run_completed\ndata: {\"ok\":true}\n\n",
        &[event("run_completed", "{\"ok\":true}", "")],
    );
    check(b"data: no type\n\n", &[event("message", "no type", "")]);
    check(
        b"event: a\ndata: 1\n\nevent: b\ndata: 2\n\n",
        &[event("a", "1", ""), event("b", "2", "")],
    );
}

#[test]
fn data_lines_are_joined_with_line_feeds() {
    check(
        b"data: one\ndata: two\ndata:\ndata: four\n\n",
        &[event("message", "one\ntwo\n\nfour", "")],
    );
    // An empty `data` is still an event, with empty data.
    check(b"data\n\n", &[event("message", "", "")]);
    check(b"data:\n\n", &[event("message", "", "")]);
}

#[test]
fn one_space_after_the_colon_is_dropped_and_no_more() {
    check(b"data:tight\n\n", &[event("message", "tight", "")]);
    check(b"data:  two\n\n", &[event("message", " two", "")]);
    check(b"data: a: b\n\n", &[event("message", "a: b", "")]);
    check(b"event:x\ndata: y\n\n", &[event("x", "y", "")]);
}

#[test]
fn comments_and_unknown_fields_are_skipped() {
    check(b": keep-alive\n\n", &[]);
    check(b":\ndata: kept\n: between\n\n", &[event("message", "kept", "")]);
    check(b"data: x\nfoo: bar\nDATA: shouted\nevent : spaced\n\n", &[event("message", "x", "")]);
}

#[test]
fn an_event_without_data_is_not_dispatched_and_its_type_does_not_carry_over() {
    check(b"event: lonely\n\ndata: next\n\n", &[event("message", "next", "")]);
    check(b"\n\n\n", &[]);
}

#[test]
fn the_last_event_id_carries_over_until_a_new_one() {
    check(
        b"id: 7\ndata: a\n\ndata: b\n\nid: 8\ndata: c\n\nid\ndata: d\n\n",
        &[
            event("message", "a", "7"),
            event("message", "b", "7"),
            event("message", "c", "8"),
            event("message", "d", ""),
        ],
    );
    // An id holding NUL is ignored; an id without data still sets it.
    check(b"id: 1\n\nid: 2\0x\ndata: e\n\n", &[event("message", "e", "1")]);
}

#[test]
fn retry_takes_digits_only() {
    let mut stream = EventStream::default();
    assert!(stream.push(b"retry: 1500\n\n").is_empty());
    assert_eq!(stream.retry(), Some(Duration::from_millis(1500)));
    assert!(stream.push(b"retry: 2s\nretry: -1\nretry:\n\n").is_empty());
    assert_eq!(stream.retry(), Some(Duration::from_millis(1500)));
}

#[test]
fn lines_end_in_crlf_lf_or_a_lone_cr() {
    let expected = [event("a", "1\n2", ""), event("b", "3", "")];
    check(b"event: a\r\ndata: 1\r\ndata: 2\r\n\r\nevent: b\r\ndata: 3\r\n\r\n", &expected);
    check(b"event: a\rdata: 1\rdata: 2\r\revent: b\rdata: 3\r\r", &expected);
    check(b"event: a\ndata: 1\r\ndata: 2\r\revent: b\r\ndata: 3\n\n", &expected);
}

#[test]
fn a_cr_ending_a_chunk_swallows_only_one_following_lf() {
    let mut stream = EventStream::default();
    assert!(stream.push(b"data: x\r").is_empty());
    // The LF belongs to the CR; the next LF is the blank line.
    assert_eq!(stream.push(b"\n\n"), [event("message", "x", "")]);
    let mut stream = EventStream::default();
    assert!(stream.push(b"data: y\r").is_empty());
    assert_eq!(stream.push(b"\r"), [event("message", "y", "")]);
}

#[test]
fn an_event_left_without_its_blank_line_is_not_an_event() {
    check(b"data: complete\n\ndata: cut off\n", &[event("message", "complete", "")]);
    check(b"data: no line end", &[]);
}

#[test]
fn a_leading_byte_order_mark_is_dropped_and_text_is_utf8() {
    check("\u{feff}data: é ✓ 🍋\n\n".as_bytes(), &[event("message", "é ✓ 🍋", "")]);
    // Only at the start: later it is part of the line (an unknown field here).
    check("data: a\n\n\u{feff}data: b\n\n".as_bytes(), &[event("message", "a", "")]);
    check(b"data: \xff\n\n", &[event("message", "\u{fffd}", "")]);
}

//! A reader of `text/event-stream` bodies (Server-Sent Events) for the
//! end-to-end tests, written apart from the product's parsers so that a test
//! does not read the gateway's streams with the gateway's own code.
//!
//! It follows the WHATWG HTML "interpreting an event stream" rules: lines end
//! in CRLF, LF or a lone CR (also when a CRLF is split between two chunks); a
//! leading byte order mark is dropped; a line starting with `:` is a comment;
//! `field: value` loses one space after the colon, and a line without a colon
//! is a field with an empty value; `event` sets the type, `data` lines are
//! joined with LF, `id` sets the last event id (unless it holds NUL) and
//! `retry` the reconnection time (digits only); other fields are ignored. A
//! blank line dispatches the event, unless it has no data, and resets its type
//! to `message`. What is left when the stream ends without a blank line is
//! not an event.

use std::time::Duration;

/// UTF-8's byte order mark, dropped at the start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event` field, or `message` when the event had none.
    pub event: String,
    /// The `data` lines, joined with LF.
    pub data: String,
    /// The last event id when the event was dispatched (ids carry over to the
    /// events that follow until a new `id` field).
    pub id: String,
}

/// The reader's state between chunks: the unfinished line and the event
/// being built.
#[derive(Debug, Default)]
pub struct EventStream {
    /// Bytes after the last line end.
    line: Vec<u8>,
    /// The previous chunk ended in CR: an LF at the start of the next one ends
    /// no second line.
    after_cr: bool,
    /// Whether any byte was read (the byte order mark is only dropped first).
    started: bool,
    event_type: String,
    data: String,
    last_id: String,
    retry: Option<Duration>,
}

impl EventStream {
    /// Reads `bytes`, cut anywhere; the events they complete, in order.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<Event> {
        if bytes.is_empty() {
            return Vec::new();
        }
        if !self.started {
            self.line.extend_from_slice(bytes);
            if self.line.len() < BOM.len() && BOM.starts_with(&self.line) {
                // Not enough yet to tell a byte order mark from text.
                return Vec::new();
            }
            self.started = true;
            let held = std::mem::take(&mut self.line);
            return self.read(held.strip_prefix(BOM).unwrap_or(&held));
        }
        if self.after_cr {
            self.after_cr = false;
            bytes = bytes.strip_prefix(b"\n").unwrap_or(bytes);
        }
        self.read(bytes)
    }

    /// The reconnection time the stream asked for, if any.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    fn read(&mut self, mut bytes: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(end) = bytes.iter().position(|&b| b == b'\r' || b == b'\n') {
            self.line.extend_from_slice(&bytes[..end]);
            let line = std::mem::take(&mut self.line);
            self.line_ended(&line, &mut out);
            let is_cr = bytes[end] == b'\r';
            bytes = &bytes[end + 1..];
            if is_cr {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.line.extend_from_slice(bytes);
        out
    }

    fn line_ended(&mut self, line: &[u8], out: &mut Vec<Event>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.find(':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(' ').unwrap_or(value))
            }
            None => (&*line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event_type),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => value.clone_into(&mut self.last_id),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok().map(Duration::from_millis);
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) {
        let event_type = std::mem::take(&mut self.event_type);
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop();
        let event = if event_type.is_empty() { "message".to_owned() } else { event_type };
        out.push(Event { event, data, id: self.last_id.clone() });
    }
}

#[cfg(test)]
mod tests;

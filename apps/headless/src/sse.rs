//! Reading a Server-Sent Events stream: `event:` and `data:` lines, a blank line
//! ends an event. Comments (`:` lines) are keep-alives and skipped.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Turns chunks of bytes into events; holds partial lines between chunks.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() || !self.event.is_empty() {
                    let event = if self.event.is_empty() {
                        "message".to_owned()
                    } else {
                        std::mem::take(&mut self.event)
                    };
                    out.push(SseEvent { event, data: self.data.join("\n") });
                    self.data.clear();
                }
            } else if let Some(value) = line.strip_prefix("event:") {
                self.event = value.trim_start().to_owned();
            } else if let Some(value) = line.strip_prefix("data:") {
                self.data.push(value.strip_prefix(' ').unwrap_or(value).to_owned());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_may_span_chunks() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"event: delta\ndata: {\"a\"").is_empty());
        let events = parser.push(b":1}\n\n: keep-alive\n\nevent: x\ndata: one\ndata: two\n\n");
        assert_eq!(
            events,
            [
                SseEvent { event: "delta".into(), data: "{\"a\":1}".into() },
                SseEvent { event: "x".into(), data: "one\ntwo".into() }
            ]
        );
    }
}

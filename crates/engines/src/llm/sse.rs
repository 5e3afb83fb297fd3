//! An incremental Server-Sent Events parser: bytes in any chunking in, events
//! out, as the WHATWG `text/event-stream` rules read them.
//!
//! Lines end in LF, CRLF or a lone CR (a CRLF split across two chunks is one
//! line end); `:` starts a comment; `data:` lines of one event are joined with
//! `\n`; a blank line dispatches the event. Bytes are kept until their line is
//! complete, so a chunk may end inside a UTF-8 sequence. A line longer than the
//! parser's bound is an error instead of unbounded memory.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the event had one.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

impl SseEvent {
    /// The `data: [DONE]` sentinel OpenAI-style streams end with.
    pub fn is_done(&self) -> bool {
        self.data.trim() == "[DONE]"
    }
}

/// Why a stream cannot be read as SSE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event-stream line is longer than {max} bytes")]
    LineTooLong { max: usize },
    #[error("an event is longer than {max} bytes")]
    EventTooLong { max: usize },
}

/// The longest line (and event) accepted by [`SseParser::default`]: 8 MiB, room
/// for a large tool-call argument in one `data:` line.
pub const DEFAULT_MAX_LINE: usize = 8 * 1024 * 1024;

/// The parser's state between chunks.
#[derive(Debug)]
pub struct SseParser {
    /// The bytes of the line not yet ended.
    line: Vec<u8>,
    /// The previous chunk ended in CR: a LF starting this one belongs to it.
    skip_lf: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    max_line: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new(DEFAULT_MAX_LINE)
    }
}

impl SseParser {
    /// A parser refusing lines and events longer than `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        SseParser {
            line: Vec::new(),
            skip_lf: false,
            event: None,
            data: String::new(),
            has_data: false,
            max_line,
        }
    }

    /// Reads `bytes`, appending every event they complete to `out`.
    ///
    /// # Errors
    /// A line or event over the bound; the parser should not be fed again.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.skip_lf && !bytes.is_empty() {
            self.skip_lf = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.push_line_bytes(&bytes[..end])?;
            self.end_line(out)?;
            let lf_follows = bytes.get(end + 1) == Some(&b'\n');
            if bytes[end] == b'\r' && end + 1 == bytes.len() {
                self.skip_lf = true;
            }
            bytes = &bytes[end + 1 + usize::from(bytes[end] == b'\r' && lf_follows)..];
        }
        self.push_line_bytes(bytes)
    }

    /// The stream ended: a last line without its end, and an event without its
    /// blank line, are taken as if they were complete.
    ///
    /// # Errors
    /// An event over the bound.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if !self.line.is_empty() {
            self.end_line(out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > self.max_line {
            return Err(SseError::LineTooLong { max: self.max_line });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line);
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*text, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => {
                if self.data.len() + value.len() + 1 > self.max_line {
                    return Err(SseError::EventTooLong { max: self.max_line });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            // `id` and `retry` matter to reconnecting clients only; a POST
            // stream is never resumed. Unknown fields are ignored by the rules.
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if !self.has_data {
            self.data.clear();
            return;
        }
        self.has_data = false;
        out.push(SseEvent { event, data: std::mem::take(&mut self.data) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        ": a comment\r\n",
        "event: message_start\r\n",
        "data: {\"a\":\"h\u{e9}llo \u{1f34b}\"}\r\n",
        "\r\n",
        "data: line one\n",
        "data: line two\n",
        "\n",
        "event: ping\r",
        "data:no space\r",
        "\r",
        "id: 7\n",
        "retry: 100\n",
        "\n",
        "data: [DONE]\n\n",
    );

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: Some("message_start".to_owned()),
                data: "{\"a\":\"h\u{e9}llo \u{1f34b}\"}".to_owned(),
            },
            SseEvent { event: None, data: "line one\nline two".to_owned() },
            SseEvent { event: Some("ping".to_owned()), data: "no space".to_owned() },
            SseEvent { event: None, data: "[DONE]".to_owned() },
        ]
    }

    fn parse_chunks(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out).expect("parses");
        }
        parser.finish(&mut out).expect("finishes");
        out
    }

    #[test]
    fn whole_stream_at_once() {
        let events = parse_chunks(&[STREAM.as_bytes()]);
        assert_eq!(events, expected());
        assert!(events[3].is_done());
        assert!(!events[0].is_done());
    }

    #[test]
    fn every_split_into_two_chunks_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        for cut in 0..=bytes.len() {
            assert_eq!(parse_chunks(&[&bytes[..cut], &bytes[cut..]]), expected(), "cut at {cut}");
        }
    }

    #[test]
    fn one_byte_at_a_time_gives_the_same_events() {
        let chunks: Vec<&[u8]> = STREAM.as_bytes().chunks(1).collect();
        assert_eq!(parse_chunks(&chunks), expected());
    }

    #[test]
    fn splits_inside_utf8_and_crlf_with_empty_chunks_between() {
        let bytes = "data: \u{1f34b}\r\n\r\n".as_bytes();
        // 6 = inside nothing yet, 7..9 inside the four-byte lemon, 11 between CR and LF.
        let chunks: Vec<&[u8]> =
            vec![&bytes[..7], b"", &bytes[7..9], &bytes[9..11], b"", &bytes[11..12], &bytes[12..]];
        assert_eq!(
            parse_chunks(&chunks),
            vec![SseEvent { event: None, data: "\u{1f34b}".to_owned() }]
        );
    }

    #[test]
    fn a_lone_cr_then_lf_in_the_next_chunk_is_one_line_end() {
        // Were the LF a second line end, the blank line would dispatch early and
        // `data: b` would be its own event.
        let events = parse_chunks(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(events, vec![SseEvent { event: None, data: "a\nb".to_owned() }]);
    }

    #[test]
    fn an_event_without_data_is_not_dispatched_and_its_name_does_not_leak() {
        let events = parse_chunks(&[b"event: ping\n\ndata: x\n\n"]);
        assert_eq!(events, vec![SseEvent { event: None, data: "x".to_owned() }]);
    }

    #[test]
    fn an_unterminated_last_event_is_taken_at_the_end() {
        assert_eq!(
            parse_chunks(&[b"event: e\ndata: tail"]),
            vec![SseEvent { event: Some("e".to_owned()), data: "tail".to_owned() }]
        );
    }

    #[test]
    fn a_line_over_the_bound_is_an_error_across_chunks() {
        let mut parser = SseParser::new(16);
        let mut out = Vec::new();
        parser.feed(b"data: 0123456", &mut out).expect("under the bound");
        assert_eq!(parser.feed(b"789abcdef", &mut out), Err(SseError::LineTooLong { max: 16 }));
    }

    #[test]
    fn an_event_over_the_bound_is_an_error() {
        let mut parser = SseParser::new(16);
        let mut out = Vec::new();
        assert_eq!(
            parser.feed(b"data: 0123456\ndata: 0123456\ndata: 0123456\n", &mut out),
            Err(SseError::EventTooLong { max: 16 })
        );
        assert!(out.is_empty());
    }
}

//! The Prometheus text exposition format, version 0.0.4: families with their
//! `# HELP` and `# TYPE` lines, then their samples, label values escaped.

use std::fmt::{self, Write as _};

/// The content type of a scrape's answer.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The kind of a family, as its `# TYPE` line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A scrape's text, written family by family.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample line: `name{label="value",…} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{label}=\"{}\"", escape_label_value(value));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A histogram's samples: cumulative `_bucket{le}` lines ending with
    /// `+Inf`, `_sum` and `_count`. `counts` holds one count per bound plus
    /// the overflow; the `+Inf` bucket and `_count` are their total.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (i, count) in counts.iter().enumerate() {
            cumulative = cumulative.saturating_add(*count);
            let le = bounds.get(i).map_or_else(|| "+Inf".to_owned(), |bound| format!("{bound}"));
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative);
        }
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, cumulative);
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// `\` and line feeds escaped, as `# HELP` text needs.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `\`, `"` and line feeds escaped, as a label value needs.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

//! A small reader of the Prometheus text exposition format (0.0.4), strict
//! enough to catch what a scraper would refuse: every line is a `# HELP`, a
//! `# TYPE` or a well-formed sample; every sample belongs to a family with a
//! `TYPE` given before it; label values are properly escaped; histogram
//! buckets are cumulative, end with `+Inf`, and `+Inf` equals `_count`.

use std::collections::BTreeMap;

/// Label names and values, in order.
type Labels = Vec<(String, String)>;

/// One sample: its name, labels in order, and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(label, _)| label == name).map(|(_, value)| value.as_str())
    }
}

/// A scrape, read and checked.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Family name → its `TYPE`.
    pub types: BTreeMap<String, String>,
    /// Family name → its `HELP`.
    pub helps: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// Reads `text` and checks it as a whole.
    ///
    /// # Errors
    /// The first line that breaks the format, or the first family that does.
    pub fn parse(text: &str) -> Result<Scrape, String> {
        let mut scrape = Scrape::default();
        for (n, line) in text.lines().enumerate() {
            let at = |message: &str| format!("line {}: {message}: {line:?}", n + 1);
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                check_name(name).map_err(|e| at(&e))?;
                if scrape.helps.insert(name.to_owned(), help.to_owned()).is_some() {
                    return Err(at("a second HELP"));
                }
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or_else(|| at("TYPE without a type"))?;
                check_name(name).map_err(|e| at(&e))?;
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(at("unknown type"));
                }
                if scrape.samples.iter().any(|s| family_of(&s.name, kind) == name) {
                    return Err(at("TYPE after the family's samples"));
                }
                if scrape.types.insert(name.to_owned(), kind.to_owned()).is_some() {
                    return Err(at("a second TYPE"));
                }
            } else if line.starts_with('#') {
                continue;
            } else {
                let sample = parse_sample(line).map_err(|e| at(&e))?;
                let family = scrape
                    .types
                    .iter()
                    .map(|(name, kind)| (name, family_of(&sample.name, kind)))
                    .find(|(name, family)| *name == family)
                    .map(|(name, _)| name.clone())
                    .ok_or_else(|| at("a sample of a family without TYPE"))?;
                if !scrape.helps.contains_key(&family) {
                    return Err(at("a sample of a family without HELP"));
                }
                scrape.samples.push(sample);
            }
        }
        scrape.check_histograms()?;
        Ok(scrape)
    }

    /// The samples named `name` whose labels include every one of `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| labels.iter().all(|(label, value)| s.label(label) == Some(*value)))
            .collect()
    }

    /// The one sample named `name` with exactly the labels `labels` (any order).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels.iter().all(|(label, value)| s.label(label) == Some(*value))
            })
            .map(|s| s.value)
    }

    fn check_histograms(&self) -> Result<(), String> {
        for (family, _) in self.types.iter().filter(|(_, kind)| *kind == "histogram") {
            let bucket = format!("{family}_bucket");
            // Series: the labels other than `le`.
            let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
            for sample in self.samples.iter().filter(|s| s.name == bucket) {
                let le = sample.label("le").ok_or_else(|| format!("{bucket} without le"))?;
                let bound = parse_value(le).map_err(|e| format!("{bucket} le: {e}"))?;
                let rest: Vec<_> =
                    sample.labels.iter().filter(|(l, _)| l != "le").cloned().collect();
                series.entry(rest).or_default().push((bound, sample.value));
            }
            for (labels, buckets) in &series {
                let mut previous = (f64::NEG_INFINITY, 0.0);
                for &(bound, count) in buckets {
                    if bound <= previous.0 {
                        return Err(format!("{family} {labels:?}: le {bound} not increasing"));
                    }
                    if count < previous.1 {
                        return Err(format!("{family} {labels:?}: bucket {bound} not cumulative"));
                    }
                    previous = (bound, count);
                }
                if previous.0 != f64::INFINITY {
                    return Err(format!("{family} {labels:?}: no +Inf bucket"));
                }
                let key: Vec<(&str, &str)> =
                    labels.iter().map(|(l, v)| (l.as_str(), v.as_str())).collect();
                let count = self
                    .value(&format!("{family}_count"), &key)
                    .ok_or_else(|| format!("{family} {labels:?}: no _count"))?;
                if count != previous.1 {
                    return Err(format!(
                        "{family} {labels:?}: +Inf {} != count {count}",
                        previous.1
                    ));
                }
                if self.value(&format!("{family}_sum"), &key).is_none() {
                    return Err(format!("{family} {labels:?}: no _sum"));
                }
            }
        }
        Ok(())
    }
}

/// The family a sample named `name` belongs to if that family is of `kind`.
fn family_of<'a>(name: &'a str, kind: &str) -> &'a str {
    if kind == "histogram" || kind == "summary" {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(family) = name.strip_suffix(suffix) {
                return family;
            }
        }
    }
    name
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        Ok(())
    } else {
        Err(format!("bad metric name {name:?}"))
    }
}

fn check_label_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!("bad label name {name:?}"))
    }
}

fn parse_value(raw: &str) -> Result<f64, String> {
    match raw {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => raw.parse::<f64>().map_err(|_| format!("bad value {raw:?}")),
    }
}

/// `name{label="value",…} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let end;
        loop {
            // A label name up to '='.
            let start = match chars.peek() {
                Some(&(_, '}')) => {
                    end = chars.next().map(|(i, _)| i);
                    break;
                }
                Some(&(i, _)) => i,
                None => return Err("unterminated labels".into()),
            };
            let eq = inner[start..].find('=').ok_or("label without =")? + start;
            let label = &inner[start..eq];
            check_label_name(label)?;
            while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {label} value not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => return Err(format!("bad escape {other:?} in label {label}")),
                    },
                    Some((_, '"')) => break,
                    Some((_, '\n')) | None => return Err(format!("unterminated value of {label}")),
                    Some((_, c)) => value.push(c),
                }
            }
            if labels.iter().any(|(l, _): &(String, String)| l == label) {
                return Err(format!("label {label} twice"));
            }
            labels.push((label.to_owned(), value));
            match chars.next() {
                Some((_, ',')) => {}
                Some((i, '}')) => {
                    end = Some(i);
                    break;
                }
                other => return Err(format!("expected , or }} after a label, got {other:?}")),
            }
        }
        let end = end.ok_or("unterminated labels")?;
        rest = &inner[end + 1..];
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut parts = rest.split(' ');
    let value = parse_value(parts.next().ok_or("no value")?)?;
    if let Some(timestamp) = parts.next() {
        timestamp.parse::<i64>().map_err(|_| format!("bad timestamp {timestamp:?}"))?;
    }
    if parts.next().is_some() {
        return Err("trailing text".into());
    }
    Ok(Sample { name: name.to_owned(), labels, value })
}

#[cfg(test)]
mod tests {
    use super::Scrape;

    const GOOD: &str = "# HELP a_total A counter.\n# TYPE a_total counter\n\
        a_total{engine=\"echo\",session=\"chat \\\"1\\\"\\n\"} 3\n\
        # HELP h_seconds H.\n# TYPE h_seconds histogram\n\
        h_seconds_bucket{le=\"0.5\"} 1\nh_seconds_bucket{le=\"+Inf\"} 2\n\
        h_seconds_sum 0.75\nh_seconds_count 2\n";

    #[test]
    fn a_good_scrape_is_read_with_its_escapes() {
        let scrape = Scrape::parse(GOOD).unwrap();
        assert_eq!(scrape.types["a_total"], "counter");
        let sample = &scrape.find("a_total", &[("engine", "echo")])[0];
        assert_eq!(sample.label("session"), Some("chat \"1\"\n"));
        assert_eq!(sample.value, 3.0);
        assert_eq!(scrape.value("h_seconds_count", &[]), Some(2.0));
    }

    #[test]
    fn broken_scrapes_are_refused() {
        for (text, why) in [
            ("a 1\n", "no TYPE"),
            ("# TYPE a gauge\na 1\n", "no HELP"),
            ("# HELP a A.\n# TYPE a gauge\na{x=\"1} 1\n", "unterminated value"),
            ("# HELP a A.\n# TYPE a gauge\na{x=\"\\q\"} 1\n", "bad escape"),
            ("# HELP a A.\n# TYPE a gauge\na{x=1} 1\n", "unquoted"),
            ("# HELP a A.\n# TYPE a gauge\na one\n", "bad value"),
            ("# HELP a A.\n# TYPE a gauge\na 1 2 3\n", "trailing"),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
                "not cumulative",
            ),
            ("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_sum 1\nh_count 2\n", "no +Inf"),
            (
                "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",
                "+Inf != count",
            ),
        ] {
            assert!(Scrape::parse(text).is_err(), "accepted ({why}): {text}");
        }
    }
}

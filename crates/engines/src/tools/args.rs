//! Reading a tool call's arguments. Models are loose with types, so strings
//! are trimmed (a blank one counts as absent), integers are also read from
//! numeric strings and booleans from `1/true/yes/on` and `0/false/no/off`.
//! Anything else is an error naming the argument.

use serde_json::{Map, Value};

/// The arguments object of one call.
#[derive(Debug)]
pub(super) struct Args<'a> {
    map: Option<&'a Map<String, Value>>,
}

impl<'a> Args<'a> {
    /// `null` reads as no arguments.
    ///
    /// # Errors
    /// Arguments that are not a JSON object.
    pub(super) fn new(value: &'a Value) -> Result<Self, String> {
        match value {
            Value::Object(map) => Ok(Args { map: Some(map) }),
            Value::Null => Ok(Args { map: None }),
            _ => Err("the arguments must be a JSON object".to_owned()),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map?.get(key).filter(|value| !value.is_null())
    }

    /// A string, trimmed; blank is `None`.
    pub(super) fn str(&self, key: &str) -> Result<Option<String>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => {
                let trimmed = s.trim();
                Ok((!trimmed.is_empty()).then(|| trimmed.to_owned()))
            }
            Some(_) => Err(format!("{key} must be a string")),
        }
    }

    /// A string taken exactly as given (file contents, text to replace).
    pub(super) fn text(&self, key: &str) -> Result<Option<String>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{key} must be a string")),
        }
    }

    /// A string that must be there.
    pub(super) fn required_str(&self, key: &str) -> Result<String, String> {
        self.str(key)?.ok_or_else(|| format!("Missing required parameter: {key}"))
    }

    /// A non-negative integer.
    pub(super) fn uint(&self, key: &str) -> Result<Option<u64>, String> {
        let bad = || format!("{key} must be a non-negative integer");
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) => Ok(Some(v)),
                // 30000.0 from a model that writes every number as a float.
                None => match n.as_f64() {
                    Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= 9.0e15 => Ok(Some(f as u64)),
                    _ => Err(bad()),
                },
            },
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => s.trim().parse().map(Some).map_err(|_| bad()),
            Some(_) => Err(bad()),
        }
    }

    /// A boolean.
    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::Number(n)) if n.as_u64() == Some(1) => Ok(Some(true)),
            Some(Value::Number(n)) if n.as_u64() == Some(0) => Ok(Some(false)),
            Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "" => Ok(None),
                "1" | "true" | "yes" | "on" => Ok(Some(true)),
                "0" | "false" | "no" | "off" => Ok(Some(false)),
                _ => Err(format!("{key} must be a boolean")),
            },
            Some(_) => Err(format!("{key} must be a boolean")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn loose_values_are_read_and_wrong_types_named() {
        let value = json!({
            "s": "  hi ", "blank": "  ", "n": 5, "ns": " 7 ", "f": 3.0, "neg": -1,
            "t": "YES", "o": "off", "one": 1, "bad": "maybe", "arr": [1]
        });
        let args = Args::new(&value).unwrap();
        assert_eq!(args.str("s").unwrap().as_deref(), Some("hi"));
        assert_eq!(args.text("s").unwrap().as_deref(), Some("  hi "));
        assert_eq!(args.str("blank").unwrap(), None);
        assert_eq!(args.str("missing").unwrap(), None);
        assert_eq!(args.uint("n").unwrap(), Some(5));
        assert_eq!(args.uint("ns").unwrap(), Some(7));
        assert_eq!(args.uint("f").unwrap(), Some(3));
        assert_eq!(args.uint("neg").unwrap_err(), "neg must be a non-negative integer");
        assert_eq!(args.bool("t").unwrap(), Some(true));
        assert_eq!(args.bool("o").unwrap(), Some(false));
        assert_eq!(args.bool("one").unwrap(), Some(true));
        assert_eq!(args.bool("bad").unwrap_err(), "bad must be a boolean");
        assert_eq!(args.str("arr").unwrap_err(), "arr must be a string");
        assert_eq!(args.required_str("blank").unwrap_err(), "Missing required parameter: blank");
        assert!(Args::new(&json!(null)).unwrap().str("x").unwrap().is_none());
        assert_eq!(Args::new(&json!([1])).unwrap_err(), "the arguments must be a JSON object");
    }
}

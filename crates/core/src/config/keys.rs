//! Unknown keys, one way for every section: each is a warning placed in the
//! file with the closest known key (`did you mean `cli_path`?`), whether its
//! section is enabled or not; a wrong type or value stays an error.

use std::fmt;

use serde::de::{self, DeserializeOwned, Visitor};

/// A key a section does not know, found while parsing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// From the section down to the key: `["integrations", "zap", "tokn"]`.
    pub path: Vec<String>,
    /// The known key it is closest to, when one is close.
    pub suggestion: Option<String>,
}

impl UnknownKey {
    /// The key `path`, with the known key closest to its last part among `known`.
    pub fn new<'a>(path: Vec<String>, known: impl IntoIterator<Item = &'a str>) -> Self {
        let suggestion = path.last().and_then(|last| did_you_mean(last, known)).map(str::to_owned);
        UnknownKey { path, suggestion }
    }
}

/// The candidate closest to `given` by edit distance, when it is close enough
/// to be a typo: at most a third of the longer name's length (at least 1),
/// or `given` is a prefix of it.
pub fn did_you_mean<'a>(
    given: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .filter(|candidate| *candidate != given)
        .map(|candidate| (edit_distance(given, candidate), candidate))
        .filter(|(distance, candidate)| {
            let limit = (given.chars().count().max(candidate.chars().count()) / 3).max(1);
            *distance <= limit || (given.len() >= 3 && candidate.starts_with(given))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance with adjacent transpositions counted as one edit
/// (`cluade` → `claude` is 1).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best =
                (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// The field names of a struct that derives `Deserialize`, read from what
/// serde's derive passes to the deserializer: the known keys of a section, with
/// no list to keep in step. Empty for a type that is not a plain struct.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    match T::deserialize(FieldProbe) {
        Err(Probed(fields)) => fields,
        Ok(_) => &[],
    }
}

/// A section's key with a wrong type or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if key.is_empty() { String::new() } else { format!("`{}`: ", key.join(".")) })]
pub struct TableError {
    /// From the section down to the key (`["integrations", "zap", "mode"]`);
    /// empty when no single key is to blame.
    pub key: Vec<String>,
    /// toml's message, on one line.
    pub message: String,
}

/// Parses `table` as `T`, collecting the keys `T` ignores as paths from the
/// section down (`["integrations", "zap", "tokn"]`).
///
/// # Errors
/// A wrong type or value, naming the key to blame: found by parsing each key
/// alone (every key of a section this is used for has a default), down into
/// nested tables, so the error can point at it in the file.
pub fn parse_table<T: DeserializeOwned>(
    table: &toml::Table,
) -> Result<(T, Vec<Vec<String>>), TableError> {
    let mut ignored = Vec::new();
    let value = toml::Value::Table(table.clone());
    match serde_ignored::deserialize(value, |path| ignored.push(path_keys(&path))) {
        Ok(parsed) => Ok((parsed, ignored)),
        Err(error) => {
            let error: toml::de::Error = error;
            let message = error.message().trim().replace('\n', " ");
            Err(TableError { key: culprit::<T>(table, Vec::new()).unwrap_or_default(), message })
        }
    }
}

/// [`parse_table`] for a section whose keys are `T`'s own: each key `T`
/// ignores as an [`UnknownKey`] with the closest of `T`'s field names.
///
/// # Errors
/// As [`parse_table`].
pub fn parse_section<T: DeserializeOwned>(
    table: &toml::Table,
) -> Result<(T, Vec<UnknownKey>), TableError> {
    let (parsed, ignored) = parse_table::<T>(table)?;
    let known = field_names::<T>();
    let unknown =
        ignored.into_iter().map(|path| UnknownKey::new(path, known.iter().copied())).collect();
    Ok((parsed, unknown))
}

/// The key of `table` (under `prefix`, the path to it from the section) that
/// `T` cannot parse on its own, narrowed into nested tables.
fn culprit<T: DeserializeOwned>(table: &toml::Table, prefix: Vec<String>) -> Option<Vec<String>> {
    let fails = |path: &[String], value: &toml::Value| {
        // The key alone, nested under its path from the section.
        let mut single = value.clone();
        for part in path.iter().rev() {
            let mut table = toml::Table::new();
            table.insert(part.clone(), single);
            single = toml::Value::Table(table);
        }
        single.try_into::<T>().is_err()
    };
    for (key, value) in table {
        let mut path = prefix.clone();
        path.push(key.clone());
        if !fails(&path, value) {
            continue;
        }
        if let toml::Value::Table(inner) = value {
            if let Some(deeper) = culprit::<T>(inner, path.clone()) {
                return Some(deeper);
            }
        }
        return Some(path);
    }
    None
}

fn path_keys(path: &serde_ignored::Path<'_>) -> Vec<String> {
    use serde_ignored::Path as P;
    match path {
        P::Root => Vec::new(),
        P::Seq { parent, index } => {
            let mut keys = path_keys(parent);
            keys.push(index.to_string());
            keys
        }
        P::Map { parent, key } => {
            let mut keys = path_keys(parent);
            keys.push(key.clone());
            keys
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            path_keys(parent)
        }
    }
}

/// The "error" [`FieldProbe`] ends with: the struct's fields.
#[derive(Debug)]
struct Probed(&'static [&'static str]);

impl fmt::Display for Probed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field names probed")
    }
}

impl std::error::Error for Probed {}

impl de::Error for Probed {
    fn custom<M: fmt::Display>(_message: M) -> Self {
        Probed(&[])
    }
}

/// A deserializer that answers every request with [`Probed`], carrying the
/// fields when asked for a struct.
#[derive(Debug)]
struct FieldProbe;

impl<'de> de::Deserializer<'de> for FieldProbe {
    type Error = Probed;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Probed> {
        Err(Probed(&[]))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Probed> {
        Err(Probed(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // the fields are only probed
    struct Section {
        cli_path: Option<String>,
        enabled: Option<bool>,
    }

    #[test]
    fn typos_get_the_closest_known_name() {
        let known = ["claude", "codex", "opencode", "pi", "droid", "echo"];
        assert_eq!(did_you_mean("cluade", known), Some("claude"));
        assert_eq!(did_you_mean("claud", known), Some("claude"));
        assert_eq!(did_you_mean("codx", known), Some("codex"));
        assert_eq!(did_you_mean("cli_pth", ["cli_path", "model"]), Some("cli_path"));
        assert_eq!(did_you_mean("allowed_chat_id", ["allowed_chat_ids"]), Some("allowed_chat_ids"));
        assert_eq!(did_you_mean("zzzzzz", known), None);
        assert_eq!(did_you_mean("claude", known), None, "a known name is no typo");
    }

    #[test]
    fn field_names_come_from_the_derive() {
        assert_eq!(field_names::<Section>(), ["cli_path", "enabled"]);
        assert!(field_names::<String>().is_empty());
    }

    #[test]
    fn ignored_keys_are_paths_from_the_section() {
        let table: toml::Table = toml::from_str("cli_pth = \"x\"\nenabled = true").unwrap();
        let (section, ignored): (Section, _) = parse_table(&table).unwrap();
        assert_eq!(section.enabled, Some(true));
        assert_eq!(ignored, vec![vec!["cli_pth".to_owned()]]);
        let wrong: toml::Table = toml::from_str("cli_path = \"x\"\nenabled = 3").unwrap();
        let err = parse_table::<Section>(&wrong).unwrap_err();
        assert_eq!(err.key, ["enabled"]);
        assert_eq!(err.to_string(), "`enabled`: invalid type: integer `3`, expected a boolean");
    }
}

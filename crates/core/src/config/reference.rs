//! Keys of the reference gateway's layout that a section parsed here reads
//! under another name, or accepts without a use.
//!
//! A config written for the reference gateway loads without losing a
//! setting: a key that names one of ours (`[gateway.sms] webhook_port` is
//! `port`) is read as ours, and a key whose setting has no meaning here is
//! accepted with a note that says what happens instead. Where one of ours
//! and its reference name are both written, ours is used and a note names
//! both. Notes are placed in the file like unknown keys
//! ([`super::key_note_warning`]) but never say "ignored".

use super::keys::TableError;

/// A remark about a key that is read, not ignored: an alias that lost to our
/// own key, or a reference key with no effect here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNote {
    /// From the section down to the key: `["webhook_port"]`.
    pub path: Vec<String>,
    /// What happens, as a sentence fragment: `` both `port` and `webhook_port`
    /// are set; `port` is used ``.
    pub message: String,
}

impl KeyNote {
    pub fn new(path: &[&str], message: impl Into<String>) -> Self {
        KeyNote { path: path.iter().map(|p| (*p).to_owned()).collect(), message: message.into() }
    }
}

/// How one top-level key written for the reference gateway is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReferenceKey {
    /// `theirs` is another name of our `ours`.
    Alias { theirs: &'static str, ours: &'static str },
    /// Accepted and not used: `what_happens` says what the gateway does
    /// instead (`"accepted; …"` is put before it).
    Inert { key: &'static str, what_happens: &'static str },
}

/// A section with the reference's keys taken: each alias moved to our name,
/// each inert key removed, and a note for each that the user should know
/// about. Errors found in the moved values are reported under the name the
/// file uses ([`Translation::in_file`]).
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// The section as our parser reads it.
    pub table: toml::Table,
    pub notes: Vec<KeyNote>,
    /// `(our path, the file's path)` of every value moved.
    moved: Vec<(Vec<String>, Vec<String>)>,
}

impl Translation {
    /// `table` with `keys` taken.
    pub fn new(table: &toml::Table, keys: &[ReferenceKey]) -> Self {
        let mut out = Translation { table: table.clone(), ..Translation::default() };
        for key in keys {
            match *key {
                ReferenceKey::Alias { theirs, ours } => out.alias(&[theirs], &[ours]),
                ReferenceKey::Inert { key, what_happens } => {
                    if out.table.remove(key).is_some() {
                        out.notes.push(KeyNote::new(&[key], format!("accepted; {what_happens}")));
                    }
                }
            }
        }
        out
    }

    /// Moves the value at `theirs` to `ours` unless `ours` is set, in which
    /// case it is dropped with a note naming both. Nested paths create the
    /// tables on the way.
    pub fn alias(&mut self, theirs: &[&str], ours: &[&str]) {
        let Some(value) = take(&mut self.table, theirs) else { return };
        if get(&self.table, ours).is_some() {
            let (ours, theirs) = (ours.join("."), theirs.join("."));
            self.notes.push(KeyNote {
                path: theirs.split('.').map(str::to_owned).collect(),
                message: format!(
                    "both `{ours}` and `{theirs}` (the reference's name for it) are set; `{ours}` is used"
                ),
            });
            return;
        }
        self.put(ours, value, theirs);
    }

    /// Sets `ours` to `value`, which the file wrote at `theirs`.
    pub fn put(&mut self, ours: &[&str], value: toml::Value, theirs: &[&str]) {
        let Some((last, parents)) = ours.split_last() else { return };
        let mut table = &mut self.table;
        for part in parents {
            let entry = table
                .entry((*part).to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            let toml::Value::Table(inner) = entry else { unreachable!("made a table above") };
            table = inner;
        }
        table.insert((*last).to_owned(), value);
        let owned = |path: &[&str]| path.iter().map(|p| (*p).to_owned()).collect();
        self.moved.push((owned(ours), owned(theirs)));
    }

    /// Removes the value at `path`, returning it.
    pub fn take(&mut self, path: &[&str]) -> Option<toml::Value> {
        take(&mut self.table, path)
    }

    /// The value at `path`, if set.
    pub fn get(&self, path: &[&str]) -> Option<&toml::Value> {
        get(&self.table, path)
    }

    /// `path` (ours) as the file writes it, when the value was moved there.
    pub fn file_path(&self, path: &[String]) -> Vec<String> {
        for (ours, theirs) in &self.moved {
            if path.starts_with(ours) {
                let mut out = theirs.clone();
                out.extend_from_slice(&path[ours.len()..]);
                return out;
            }
        }
        path.to_vec()
    }

    /// `error` naming the key the file wrote.
    pub fn in_file(&self, mut error: TableError) -> TableError {
        error.key = self.file_path(&error.key);
        error
    }
}

fn get<'t>(table: &'t toml::Table, path: &[&str]) -> Option<&'t toml::Value> {
    let (last, parents) = path.split_last()?;
    let mut table = table;
    for part in parents {
        table = table.get(*part)?.as_table()?;
    }
    table.get(*last)
}

/// Removes the value at `path`; a table left empty by it goes too, so no
/// empty reference table is left for the parser to call unknown.
fn take(table: &mut toml::Table, path: &[&str]) -> Option<toml::Value> {
    match path {
        [] => None,
        [last] => table.remove(*last),
        [first, rest @ ..] => {
            let inner = table.get_mut(*first)?.as_table_mut()?;
            let value = take(inner, rest)?;
            if inner.is_empty() {
                table.remove(*first);
            }
            Some(value)
        }
    }
}

/// The reference's reading of a listen address (`webhook_bind`, `bind`):
/// `127.0.0.1`, `localhost` and blank are loopback, `0.0.0.0` and `any` every
/// interface, a dotted IPv4 address itself; `None` for anything else, which
/// the reference also takes as loopback.
pub fn reference_bind(raw: &str) -> Option<String> {
    match raw.trim() {
        "" | "127.0.0.1" | "localhost" => Some("127.0.0.1".to_owned()),
        "0.0.0.0" | "any" => Some("0.0.0.0".to_owned()),
        other => other.parse::<std::net::Ipv4Addr>().ok().map(|ip| ip.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    const KEYS: &[ReferenceKey] = &[
        ReferenceKey::Alias { theirs: "webhook_port", ours: "port" },
        ReferenceKey::Inert { key: "mock_mode", what_happens: "there is no mock mode here" },
    ];

    #[test]
    fn an_alias_is_read_as_ours_and_loses_to_ours_with_a_note_naming_both() {
        let alone = Translation::new(&table("webhook_port = 4045"), KEYS);
        assert_eq!(alone.table, table("port = 4045"));
        assert!(alone.notes.is_empty());

        let both = Translation::new(&table("port = 1\nwebhook_port = 4045"), KEYS);
        assert_eq!(both.table, table("port = 1"));
        assert_eq!(
            both.notes,
            [KeyNote::new(
                &["webhook_port"],
                "both `port` and `webhook_port` (the reference's name for it) are set; `port` is used"
            )]
        );
    }

    #[test]
    fn an_inert_key_is_removed_with_a_note_that_is_not_ignored() {
        let taken = Translation::new(&table("mock_mode = true"), KEYS);
        assert!(taken.table.is_empty());
        assert_eq!(taken.notes[0].message, "accepted; there is no mock mode here");
    }

    #[test]
    fn an_error_in_a_moved_value_names_the_key_the_file_wrote() {
        let mut moved = Translation::new(&table("[outbound]\nport = \"x\""), &[]);
        moved.alias(&["outbound", "port"], &["smtp", "port"]);
        assert_eq!(moved.table, table("[smtp]\nport = \"x\""));
        let error = TableError { key: vec!["smtp".into(), "port".into()], message: "bad".into() };
        assert_eq!(moved.in_file(error).key, ["outbound", "port"]);
    }

    #[test]
    fn binds_are_read_as_the_reference_reads_them() {
        for (raw, bind) in [
            ("127.0.0.1", Some("127.0.0.1")),
            ("localhost", Some("127.0.0.1")),
            (" ", Some("127.0.0.1")),
            ("0.0.0.0", Some("0.0.0.0")),
            ("any", Some("0.0.0.0")),
            ("10.1.2.3", Some("10.1.2.3")),
            ("::1", None),
            ("example.com", None),
        ] {
            assert_eq!(reference_bind(raw).as_deref(), bind, "{raw}");
        }
    }
}

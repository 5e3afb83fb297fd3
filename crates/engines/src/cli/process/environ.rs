//! The gateway's own environment block, emptied of secrets at start.
//!
//! `/proc/<pid>/environ` shows the bytes the process was started with, not
//! what `setenv` or `unsetenv` later make of them, and on some kernels a root
//! child reads it even from a process that is not dumpable. So the gateway
//! takes its environment into memory first thing, then overwrites, in that
//! block, every entry whose name says it holds a secret ([`is_secret_name`])
//! with zero bytes: libc and `std::env` skip the empty entries, and what a
//! child can read of the gateway no longer holds the values.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

/// What [`seal_environment`] returns: the environment as it was, for the
/// gateway to read secrets and settings from, and the names it blanked.
#[derive(Debug, Default)]
pub struct SealedEnvironment {
    pub vars: BTreeMap<String, String>,
    pub blanked: Vec<String>,
}

/// Whether a variable named `name` holds a secret by its name: one containing
/// `TOKEN`, `SECRET`, `PASSWORD`, `PASSWD` or `CREDENTIAL`, or with a part
/// (between underscores) ending in `KEY` (`OPENAI_API_KEY`, `APIKEY`), in
/// any case. `LEMON_KEYCHAIN` and `XAUTHORITY` are not.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"].iter().any(|word| upper.contains(word))
        || upper.split('_').any(|part| part.ends_with("KEY"))
}

/// The process environment as it is now, without the entries that are not
/// UTF-8 (the gateway cannot use them).
pub fn environment() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .collect()
}

/// Takes the process environment, then blanks every secret's entry
/// ([`is_secret_name`]) in the block `/proc/self/environ` shows. Entries
/// that are not UTF-8 are left out of the map, as the gateway cannot use them.
///
/// Call it first thing in `main`, before any other thread starts (libc reads
/// the same bytes) and before [`super::hide_from_children`] (a process that
/// is not dumpable cannot open its own `/proc/self/mem` unless it is root).
///
/// # Errors
/// Why the block could not be rewritten (no `/proc`, a refused write), as a
/// phrase; the environment has been read by then, but the secrets are still
/// in the block.
pub fn seal_environment() -> Result<SealedEnvironment, (SealedEnvironment, String)> {
    let mut sealed = SealedEnvironment { vars: environment(), blanked: Vec::new() };
    if !sealed.vars.keys().any(|name| is_secret_name(name)) {
        return Ok(sealed);
    }
    match blank_secrets() {
        Ok(blanked) => {
            sealed.blanked = blanked;
            Ok(sealed)
        }
        Err(why) => Err((sealed, why)),
    }
}

/// Overwrites the secrets' entries of this process's environment block with
/// zero bytes; the names blanked.
fn blank_secrets() -> Result<Vec<String>, String> {
    let (start, end) = environ_bounds()?;
    let len = usize::try_from(end.saturating_sub(start))
        .map_err(|_| "the environment block is too large".to_owned())?;
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .map_err(|err| format!("cannot open /proc/self/mem: {err}"))?;
    let mut block = vec![0_u8; len];
    mem.read_exact_at(&mut block, start)
        .map_err(|err| format!("cannot read the environment block: {err}"))?;
    let mut blanked = Vec::new();
    for (offset, entry) in secret_entries(&block) {
        let zeros = vec![0_u8; entry.len()];
        mem.write_all_at(&zeros, start + offset as u64)
            .map_err(|err| format!("cannot blank an environment entry: {err}"))?;
        blanked.push(entry_name(entry));
    }
    Ok(blanked)
}

/// Where each secret's entry starts in `block` (NUL-separated `NAME=value`
/// entries), with the entry.
fn secret_entries(block: &[u8]) -> Vec<(usize, &[u8])> {
    let mut offset = 0;
    let mut found = Vec::new();
    for entry in block.split(|byte| *byte == 0) {
        if let Some(eq) = entry.iter().position(|byte| *byte == b'=') {
            if std::str::from_utf8(&entry[..eq]).is_ok_and(is_secret_name) {
                found.push((offset, entry));
            }
        }
        offset += entry.len() + 1;
    }
    found
}

fn entry_name(entry: &[u8]) -> String {
    let name = entry.split(|byte| *byte == b'=').next().unwrap_or_default();
    String::from_utf8_lossy(name).into_owned()
}

/// `env_start` and `env_end` of `/proc/self/stat` (fields 50 and 51).
fn environ_bounds() -> Result<(u64, u64), String> {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .map_err(|err| format!("cannot read /proc/self/stat: {err}"))?;
    stat_environ_bounds(&stat).ok_or_else(|| "/proc/self/stat has no environment bounds".into())
}

/// Fields 50 and 51 of a `stat` line; the command name (field 2) may hold
/// spaces and parentheses, so counting starts after its last `)`.
fn stat_environ_bounds(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(50 - 3);
    let start = fields.next()?.parse().ok()?;
    let end = fields.next()?.parse().ok()?;
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_told_by_their_words() {
        for name in [
            "LEMON_API_TOKEN",
            "OPENAI_API_KEY",
            "anthropic_api_key",
            "APIKEY",
            "TWILIO_AUTH_TOKEN",
            "IMAP_PASSWORD",
            "DB_PASSWD",
            "AWS_SECRET_ACCESS_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in ["PATH", "HOME", "LEMON_KEYCHAIN", "XAUTHORITY", "KEYBOARD_LAYOUT", "LEMON_LOG"]
        {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn the_secret_entries_of_a_block_are_found_where_they_are() {
        let block = b"PATH=/bin\0OPENAI_API_KEY=sk-1\0HOME=/root\0MY_TOKEN=a=b\0";
        let found = secret_entries(block);
        assert_eq!(found, vec![(10, &b"OPENAI_API_KEY=sk-1"[..]), (41, &b"MY_TOKEN=a=b"[..])]);
        assert_eq!(&block[41..53], b"MY_TOKEN=a=b");
        assert_eq!(entry_name(found[1].1), "MY_TOKEN");
    }

    #[test]
    fn the_bounds_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[50 - 3] = "1000".into();
        fields[51 - 3] = "2000".into();
        let stat = format!("42 (a) b (c)) {}", fields.join(" "));
        assert_eq!(stat_environ_bounds(&stat), Some((1000, 2000)));
        assert_eq!(stat_environ_bounds("42 (short) S 1"), None);
    }

    /// The bounds read from `stat` are those of the block `/proc/self/environ`
    /// shows (blanking itself is tested on the real binary, whose block it
    /// rewrites before any thread starts).
    #[test]
    fn the_bounds_are_those_of_the_block_proc_shows() {
        let (start, end) = environ_bounds().unwrap();
        let shown = std::fs::read("/proc/self/environ").unwrap();
        assert_eq!(usize::try_from(end - start).unwrap(), shown.len());
    }
}

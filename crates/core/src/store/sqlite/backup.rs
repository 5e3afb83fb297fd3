//! Backup and restore of a store's file, while a gateway runs on it or not.
//!
//! - [`backup`] copies the database with `VACUUM INTO` on a connection of its
//!   own: a read transaction, so it sees one consistent moment and never holds
//!   the writer back (in WAL mode readers and the writer do not wait for each
//!   other). The copy is a compact file with no log beside it, 0600.
//! - [`restore`] puts such a copy in place of a store's file. It refuses while
//!   a store is open on the file: every open store holds the lock file beside
//!   the database (`lemon.db.lock`) shared, and a restore takes it exclusive.
//!   The copy is checked first (a Lemon database of a schema this build can
//!   read, intact), the replaced file is kept as `lemon.db.before-restore`, and
//!   the new file is moved in with one rename.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::schema::SCHEMA_VERSION;

/// What a backup or a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The file written.
    pub path: PathBuf,
    pub bytes: u64,
    /// Runs in the copy.
    pub runs: u64,
}

/// Why a backup or restore did not happen; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CopyError(String);

/// `path` with `suffix` added to its file name (`lemon.db` → `lemon.db.lock`).
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The lock every open store holds shared on the file beside `db`.
///
/// # Errors
/// The lock file cannot be made, or a restore holds it.
pub(crate) fn hold_shared(db: &Path) -> Result<File, String> {
    let lock = open_lock(db)?;
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => Ok(lock),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            Err(format!("a restore is replacing {} now; start again once it is done", db.display()))
        }
        Err(err) => Err(format!("cannot lock {}: {err}", beside(db, ".lock").display())),
    }
}

fn open_lock(db: &Path) -> Result<File, String> {
    let path = beside(db, ".lock");
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|err| format!("cannot open {}: {err}", path.display()))
}

/// A new, empty file at `path`, 0600; refused when something is there.
fn fresh_file(path: &Path) -> Result<(), CopyError> {
    OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map(drop).map_err(
        |err| match err.kind() {
            std::io::ErrorKind::AlreadyExists => CopyError(format!(
                "{} already exists; name a new file, or remove it first",
                path.display()
            )),
            _ => CopyError(format!("cannot write {}: {err}", path.display())),
        },
    )
}

/// A Lemon database at `path` of a schema this build reads, opened read-only;
/// with `intact`, also read whole to check it is not damaged (`quick_check`).
fn check_database(path: &Path, intact: bool) -> Result<Connection, CopyError> {
    let not_ours = |why: String| {
        CopyError(format!(
            "{} is not a Lemon Gateway database this build can read: {why}",
            path.display()
        ))
    };
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|err| not_ours(err.to_string()))?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|err| not_ours(err.to_string()))?;
    if !(1..=SCHEMA_VERSION).contains(&version) {
        return Err(not_ours(format!(
            "its schema version is {version}, this build reads 1 to {SCHEMA_VERSION}"
        )));
    }
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('runs', 'run_events', 'journal', 'kv')",
            [],
            |row| row.get(0),
        )
        .map_err(|err| not_ours(err.to_string()))?;
    if tables != 4 {
        return Err(not_ours("it lacks the gateway's tables".to_owned()));
    }
    if intact {
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |row| row.get(0))
            .map_err(|err| not_ours(err.to_string()))?;
        if check != "ok" {
            return Err(not_ours(format!("it is damaged ({check})")));
        }
    }
    Ok(conn)
}

fn count_runs(conn: &Connection) -> u64 {
    conn.query_row("SELECT count(*) FROM runs", [], |row| row.get::<_, i64>(0))
        .map_or(0, |n| u64::try_from(n).unwrap_or(0))
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

/// The sizes of a store's files on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileSizes {
    /// The database file.
    pub database: u64,
    /// Its write-ahead log.
    pub log: u64,
}

/// The sizes of the store at `db` and of its log (0 for a file not there).
pub fn file_sizes(db: &Path) -> FileSizes {
    FileSizes { database: size(db), log: size(&beside(db, "-wal")) }
}

/// Copies the store at `db` into the new file `to`, consistently, whether a
/// gateway writes to it meanwhile or not.
///
/// # Errors
/// No store at `db`, `to` exists or cannot be written, or the copy failed
/// (the partial file is removed).
pub fn backup(db: &Path, to: &Path) -> Result<Copied, CopyError> {
    if !db.exists() {
        return Err(CopyError(format!("there is no database at {}", db.display())));
    }
    // The live file is not read whole here: the copy is, once made.
    let conn = check_database(db, false)?;
    fresh_file(to)?;
    let target = to.to_str().ok_or_else(|| CopyError(format!("{} is not UTF-8", to.display())))?;
    if let Err(err) = conn.execute("VACUUM INTO ?1", [target]) {
        let _ = std::fs::remove_file(to);
        return Err(CopyError(format!("the backup failed: {err}")));
    }
    let copy = check_database(to, true)?;
    Ok(Copied { path: to.to_owned(), bytes: size(to), runs: count_runs(&copy) })
}

/// Replaces the store at `db` by the backup `from`, keeping the replaced
/// file as `<db>.before-restore`.
///
/// # Errors
/// A gateway has the store open, `from` is no Lemon database this build can
/// read, or a file could not be moved (the store is then as it was).
pub fn restore(db: &Path, from: &Path) -> Result<Copied, CopyError> {
    let lock = open_lock(db).map_err(CopyError)?;
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            return Err(CopyError(format!(
                "a gateway is running on {} (it holds {}); stop it, then restore",
                db.display(),
                beside(db, ".lock").display()
            )))
        }
        Err(err) => return Err(CopyError(format!("cannot lock the store: {err}"))),
    }
    let source = check_database(from, true)?;
    // Made beside the store, so the last step is a rename on one filesystem.
    let incoming = beside(db, ".restoring");
    let _ = std::fs::remove_file(&incoming);
    fresh_file(&incoming)?;
    let target = incoming
        .to_str()
        .ok_or_else(|| CopyError(format!("{} is not UTF-8", incoming.display())))?;
    if let Err(err) = source.execute("VACUUM INTO ?1", [target]) {
        let _ = std::fs::remove_file(&incoming);
        return Err(CopyError(format!("the restore failed to copy {}: {err}", from.display())));
    }
    drop(source);
    if db.exists() {
        // The log holds the newest commits: copied back before the file moves.
        if let Ok(old) = Connection::open(db) {
            let _ = old.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        }
        let kept = beside(db, ".before-restore");
        std::fs::rename(db, &kept).map_err(|err| {
            let _ = std::fs::remove_file(&incoming);
            CopyError(format!("cannot keep the current store as {}: {err}", kept.display()))
        })?;
    }
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(beside(db, suffix));
    }
    std::fs::rename(&incoming, db)
        .map_err(|err| CopyError(format!("cannot move the restored store into place: {err}")))?;
    // A copy of the file checked above: opened only to count its runs.
    let restored = check_database(db, false)?;
    Ok(Copied { path: db.to_owned(), bytes: size(db), runs: count_runs(&restored) })
}

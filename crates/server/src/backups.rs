//! Backups of the store on `[gateway.backup]`'s schedule.
//!
//! Each copy is `lemon-<UTC time>.db` in the backup folder (default
//! `backups` in the home, 0700), made as `lemon-gateway backup` makes one
//! (one consistent moment, the writer never waits); the newest `keep` are
//! kept and older ones removed. The next copy is due at the schedule's first
//! slot after the newest copy there, so a slot missed while the gateway was
//! down (or a folder with no copy yet) is made up at once when it starts.

use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDateTime, Utc};
use chrono_tz::Tz;
use lemon_core::config::BackupConfig;
use lemon_core::cron::Schedule;
use lemon_core::store::upkeep::{Backup, Upkeep};
use tokio_util::sync::CancellationToken;

/// The names of the copies: `lemon-20261206T030000Z.db`, which sort by time.
const PREFIX: &str = "lemon-";
const SUFFIX: &str = ".db";
const STAMP: &str = "%Y%m%dT%H%M%SZ";

/// A schedule and where its copies go, checked by the config loader.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    every: Schedule,
    tz: Tz,
    dir: PathBuf,
    keep: usize,
}

impl Plan {
    /// The plan of `[gateway.backup]`; `None` when its schedule or time zone
    /// does not parse (the loader refuses such a file first).
    pub(crate) fn from_config(config: &BackupConfig, home: &Path) -> Option<Plan> {
        let every = Schedule::parse(&config.every).ok()?;
        let tz = match config.timezone.as_deref() {
            Some(name) => lemon_core::cron::parse_timezone(name).ok()?,
            None => Tz::UTC,
        };
        let dir = config.dir.clone().unwrap_or_else(|| home.join("backups"));
        let dir = if dir.is_absolute() { dir } else { home.join(dir) };
        Some(Plan {
            every,
            tz,
            dir,
            keep: usize::try_from(config.keep).unwrap_or(usize::MAX).max(1),
        })
    }
}

/// The time a copy's name says it was made.
fn made_at(name: &str) -> Option<DateTime<Utc>> {
    let stamp = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    NaiveDateTime::parse_from_str(stamp, STAMP).ok().map(|at| at.and_utc())
}

/// The copies in `dir`, newest first.
fn copies(dir: &Path) -> Vec<(DateTime<Utc>, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<(DateTime<Utc>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            Some((made_at(name.to_str()?)?, entry.path()))
        })
        .collect();
    found.sort_by_key(|copy| std::cmp::Reverse(copy.0));
    found
}

/// Makes a copy of `db` now and removes all but the newest `keep`.
fn take(db: &Path, plan: &Plan, now: DateTime<Utc>) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&plan.dir)
        .map_err(|err| format!("cannot make {}: {err}", plan.dir.display()))?;
    let path = plan.dir.join(format!("{PREFIX}{}{SUFFIX}", now.format(STAMP)));
    let copied = lemon_core::store::sqlite::backup(db, &path).map_err(|err| err.to_string())?;
    tracing::info!(path = %copied.path.display(), bytes = copied.bytes, runs = copied.runs, "store backed up");
    for (_, old) in copies(&plan.dir).into_iter().skip(plan.keep) {
        match std::fs::remove_file(&old) {
            Ok(()) => tracing::info!(path = %old.display(), "old backup removed"),
            Err(err) => {
                tracing::warn!(path = %old.display(), error = %err, "an old backup could not be removed")
            }
        }
    }
    Ok(path)
}

/// When the next copy is due: the first slot after the newest copy, or now
/// when there is none.
fn due(plan: &Plan, now: DateTime<Utc>) -> DateTime<Utc> {
    match copies(&plan.dir).first() {
        Some((newest, _)) => {
            plan.every.next_after(newest, &plan.tz).map_or(now, |next| next.with_timezone(&Utc))
        }
        None => now,
    }
}

/// Takes the copies `plan` asks for until `shutdown`, recording each (and the
/// newest one already there) in `upkeep`.
pub(crate) async fn run(db: PathBuf, plan: Plan, upkeep: Upkeep, shutdown: CancellationToken) {
    tracing::info!(dir = %plan.dir.display(), every = %plan.every, keep = plan.keep, "store backups scheduled");
    if let Some((at, path)) = copies(&plan.dir).into_iter().next() {
        upkeep.backed_up(Backup { at_ms: at.timestamp_millis(), path });
    }
    loop {
        let now = Utc::now();
        let wait = (due(&plan, now) - now).to_std().unwrap_or_default();
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let (db, plan_now) = (db.clone(), plan.clone());
        let taken = tokio::task::spawn_blocking(move || take(&db, &plan_now, Utc::now())).await;
        match taken {
            Ok(Ok(path)) => upkeep.backed_up(Backup { at_ms: lemon_core::clock::now_ms(), path }),
            Ok(Err(error)) => {
                tracing::error!(%error, "the scheduled backup failed; trying again at the next slot");
                upkeep.backup_failed(error);
                // Not again at once: the next slot after now.
                let now = Utc::now();
                let next = plan.every.next_after(&now, &plan.tz).map(|at| at.with_timezone(&Utc));
                let wait = next.map_or(std::time::Duration::from_secs(3600), |at| {
                    (at - now).to_std().unwrap_or_default()
                });
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
            Err(_) => {
                tracing::error!("the scheduled backup panicked");
                upkeep.backup_failed("the backup task panicked".to_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(dir: &Path, keep: u32) -> Plan {
        let config = BackupConfig {
            every: "daily at 3am".to_owned(),
            dir: Some(dir.to_owned()),
            keep,
            timezone: None,
        };
        Plan::from_config(&config, Path::new("/home/me/.lemon")).unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_copy_is_due_at_the_first_slot_after_the_newest_one_or_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan(dir.path(), 7);
        let now = at("2026-12-06T10:00:00Z");
        assert_eq!(due(&plan, now), now, "no copy yet: now");
        std::fs::write(dir.path().join("lemon-20261206T030000Z.db"), "").unwrap();
        assert_eq!(due(&plan, now), at("2026-12-07T03:00:00Z"));
        // Other files in the folder are not copies.
        std::fs::write(dir.path().join("lemon-notes.db"), "").unwrap();
        std::fs::write(dir.path().join("lemon-20991231T000000Z.txt"), "").unwrap();
        assert_eq!(due(&plan, now), at("2026-12-07T03:00:00Z"));
        // A slot missed while the gateway was down is made up at once.
        let later = at("2026-12-09T12:00:00Z");
        assert_eq!(due(&plan, later), at("2026-12-07T03:00:00Z"));
        assert!(due(&plan, later) < later);
    }

    #[test]
    fn a_relative_folder_is_in_the_home_and_the_default_is_backups() {
        let config =
            BackupConfig { every: "@daily".to_owned(), dir: None, keep: 3, timezone: None };
        let home = Path::new("/home/me/.lemon");
        assert_eq!(Plan::from_config(&config, home).unwrap().dir, home.join("backups"));
        let relative = BackupConfig { dir: Some("copies".into()), ..config };
        assert_eq!(Plan::from_config(&relative, home).unwrap().dir, home.join("copies"));
    }
}

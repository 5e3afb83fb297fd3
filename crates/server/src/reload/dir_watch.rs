//! Changes to one file, seen through its directory.
//!
//! The directory is watched rather than the file because editors save by
//! writing a new file and renaming it over the old one. The store's database
//! (and its `-wal` and `-shm`) usually sits in the same directory and is
//! written on every run, so on Linux the watch asks inotify only for the
//! events that end a write to a file or put one in place (closed after
//! writing, created, moved in or out, deleted), never for each `write`: the
//! database's writes, made through descriptors that stay open, wake nothing.
//! Events for other names are dropped as they are read. Elsewhere the
//! platform's watcher from `notify` is used and filtered by name.

use std::ffi::OsString;
use std::io;
use std::path::Path;

/// A watch on one directory that reports events naming one file in it.
pub(super) struct DirWatch {
    name: OsString,
    #[cfg(target_os = "linux")]
    events: inotify::EventStream<Vec<u8>>,
    #[cfg(not(target_os = "linux"))]
    events: tokio::sync::mpsc::UnboundedReceiver<OsString>,
    #[cfg(not(target_os = "linux"))]
    _watcher: notify_debouncer_mini::notify::RecommendedWatcher,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch").field("name", &self.name).finish_non_exhaustive()
    }
}

#[cfg(target_os = "linux")]
impl DirWatch {
    /// Watches `dir` for changes to the file called `name` in it.
    ///
    /// # Errors
    /// The directory cannot be watched (no inotify, too many watches, no directory).
    pub(super) fn new(dir: &Path, name: OsString) -> io::Result<DirWatch> {
        use inotify::{Inotify, WatchMask};
        let inotify = Inotify::init()?;
        inotify.watches().add(
            dir,
            WatchMask::CLOSE_WRITE
                | WatchMask::CREATE
                | WatchMask::MOVED_TO
                | WatchMask::MOVED_FROM
                | WatchMask::DELETE
                | WatchMask::DELETE_SELF
                | WatchMask::MOVE_SELF,
        )?;
        let events = inotify.into_event_stream(vec![0; 4096])?;
        Ok(DirWatch { name, events })
    }

    /// Waits for the next event that names the file (or the directory itself:
    /// moved or deleted, after which nothing more comes).
    ///
    /// # Errors
    /// The watch cannot be read any more.
    pub(super) async fn changed(&mut self) -> io::Result<()> {
        loop {
            match self.next_event().await? {
                Some(name) if name != self.name => {}
                _ => return Ok(()),
            }
        }
    }

    /// The name of the next event's file; `None` for the directory itself.
    async fn next_event(&mut self) -> io::Result<Option<OsString>> {
        use tokio_stream::StreamExt;
        match self.events.next().await {
            Some(event) => Ok(event?.name),
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the watch ended")),
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl DirWatch {
    /// Watches `dir` for changes to the file called `name` in it.
    ///
    /// # Errors
    /// The directory cannot be watched.
    pub(super) fn new(dir: &Path, name: OsString) -> io::Result<DirWatch> {
        use notify_debouncer_mini::notify::{self, RecursiveMode, Watcher};
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        let wanted = name.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if let Ok(event) = event {
                    if event.paths.iter().any(|p| p.file_name() == Some(wanted.as_os_str())) {
                        let _ = tx.send(wanted.clone());
                    }
                }
            })
            .map_err(io::Error::other)?;
        watcher.watch(dir, RecursiveMode::NonRecursive).map_err(io::Error::other)?;
        Ok(DirWatch { name, events, _watcher: watcher })
    }

    /// Waits for the next event that names the file.
    ///
    /// # Errors
    /// The watcher stopped.
    pub(super) async fn changed(&mut self) -> io::Result<()> {
        match self.events.recv().await {
            Some(_) => Ok(()),
            None => Err(io::Error::other(format!("the watch of {:?} stopped", self.name))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DirWatch;
    use std::future::Future;
    use std::time::Duration;

    /// Waits for `future`, at most long enough for any machine.
    async fn within<T>(future: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), future).await.expect("in time")
    }

    #[tokio::test]
    async fn a_rename_over_the_file_and_a_write_in_place_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "a = 1\n").unwrap();
        let mut watch = DirWatch::new(dir.path(), "config.toml".into()).unwrap();
        // Saved as a new file renamed over the old one.
        let new = dir.path().join(".config.toml.tmp");
        std::fs::write(&new, "a = 2\n").unwrap();
        std::fs::rename(&new, &path).unwrap();
        within(watch.changed()).await.unwrap();
        // Written in place.
        std::fs::write(&path, "a = 3\n").unwrap();
        within(watch.changed()).await.unwrap();
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn writes_through_an_open_descriptor_raise_no_event() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "a = 1\n").unwrap();
        // Like the store's database: opened once, then written and synced.
        let mut db = std::fs::File::create(dir.path().join("lemon.db")).unwrap();
        let mut watch = DirWatch::new(dir.path(), "config.toml".into()).unwrap();
        for n in 0..100 {
            writeln!(db, "row {n}").unwrap();
            db.sync_data().unwrap();
        }
        std::fs::write(&path, "a = 2\n").unwrap();
        // The first event of all is the config file's.
        let first = within(watch.next_event()).await.unwrap();
        assert_eq!(first.as_deref(), Some(std::ffi::OsStr::new("config.toml")));
    }
}

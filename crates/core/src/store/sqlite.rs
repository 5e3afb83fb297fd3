//! The SQLite backend.

use std::path::Path;

use super::{MemoryStoreAlias, StoreError};

/// SQLite store (being written).
pub type SqliteStore = MemoryStoreAlias;

impl SqliteStore {
    /// # Errors
    /// Never yet.
    pub fn open(_path: &Path, ttl: i64) -> Result<Self, StoreError> {
        Ok(Self::new(ttl))
    }
}

//! The engine lock.

/// Key of the engine lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockKey {
    Resume(String),
    Session(String),
}

/// The lock table.
#[derive(Debug, Clone, Default)]
pub struct EngineLock;

/// A held lock.
#[derive(Debug)]
pub struct LockGuard;

//! Shared test support.

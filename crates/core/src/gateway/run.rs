//! One run.

//! Lemon Gateway engines.

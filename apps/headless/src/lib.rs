//! Lemon Gateway headless app.

//! Lemon Gateway transports.

//! Test support: a scriptable fake engine.

//! The cluster as status pages show it.

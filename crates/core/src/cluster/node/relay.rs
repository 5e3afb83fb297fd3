//! Events of runs on other nodes, for local followers.

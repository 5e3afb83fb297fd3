//! A run's slot, claimed before its engine starts and freed when it ends.

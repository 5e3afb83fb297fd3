//! Single-consumer channels owned through channel leases.

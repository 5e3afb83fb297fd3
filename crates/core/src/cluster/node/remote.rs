//! Cancel and steer of a run another node owns.

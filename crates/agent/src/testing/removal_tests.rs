//! The agent's removal (the finalizer's cleanup) in-process on the paused clock.

//! Where the hub reads the time: one clock per scope, in [`crate::context::Ctx`], so the
//! reconcilers run on virtual time in tests (decision 0116-hub-clock-and-fake-apiserver).

use k8s_openapi::jiff::Timestamp;

/// The hub's clock: the system clock in production; in tests a fixed wall time that moves
/// with tokio's (paused) clock.
#[derive(Clone, Debug)]
pub(crate) enum Clock {
    /// The system clock.
    System,
    /// `base` plus the time tokio's clock moved since `start`.
    #[cfg_attr(not(test), allow(dead_code))]
    Virtual {
        base: Timestamp,
        start: tokio::time::Instant,
    },
}

impl Clock {
    /// A virtual clock reading `base` now and moving with tokio's clock.
    #[cfg(test)]
    pub(crate) fn starting_at(base: Timestamp) -> Self {
        Self::Virtual {
            base,
            start: tokio::time::Instant::now(),
        }
    }

    /// The wall time.
    pub(crate) fn now(&self) -> Timestamp {
        match self {
            Self::System => Timestamp::now(),
            Self::Virtual { base, start } => {
                let elapsed = tokio::time::Instant::now().duration_since(*start);
                base.checked_add(elapsed).unwrap_or(*base)
            }
        }
    }

    /// The wall time in milliseconds since the Unix epoch.
    pub(crate) fn unix_millis(&self) -> u64 {
        u64::try_from(self.now().as_millisecond()).unwrap_or_default()
    }

    /// A monotonic instant: tokio's, which is the system's unless a test paused it.
    pub(crate) fn instant(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}

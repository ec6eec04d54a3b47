//! Logging setup shared by every tender binary.

use std::{ffi::OsStr, fmt, io::IsTerminal, str::FromStr};

use tracing_subscriber::{EnvFilter, fmt as tfmt, layer::SubscriberExt, util::SubscriberInitExt};

use crate::{Error, Result};

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, for terminals and `kubectl logs`.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unknown log format {other:?}, expected \"text\" or \"json\""
            )),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Whether text log lines carry ANSI colour codes: only when they go to a terminal, and not
/// when `NO_COLOR` is set to a non-empty value (<https://no-color.org>). Redirected to a file,
/// piped, or collected by a container runtime, the lines stay plain text.
pub fn use_ansi(writer_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    writer_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the global tracing subscriber.
///
/// `filter` is an `EnvFilter` directive such as `info,tender_hub=debug`. A non-empty `RUST_LOG`
/// wins over it, so an operator can raise verbosity on a running Deployment by editing its
/// environment without knowing which flag the chart sets.
pub fn init(log_format: LogFormat, filter: &str) -> Result<()> {
    let directives = match std::env::var("RUST_LOG") {
        Ok(env) if !env.trim().is_empty() => env,
        _ => filter.to_owned(),
    };
    let env_filter = EnvFilter::try_new(&directives).map_err(|source| Error::LogFilter {
        filter: directives.clone(),
        source,
    })?;

    // Both layers are optional so the subscriber has a single concrete type either way.
    let (text, json) = match log_format {
        LogFormat::Text => {
            // The subscriber writes to stderr, so colour follows whether stderr is a terminal.
            let ansi = use_ansi(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
            );
            (
                Some(tfmt::layer().with_ansi(ansi).with_writer(std::io::stderr)),
                None,
            )
        }
        LogFormat::Json => (
            None,
            Some(
                tfmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            ),
        ),
    };

    tracing_subscriber::registry()
        .with(env_filter)
        .with(text)
        .with(json)
        .try_init()
        .map_err(Error::TelemetryInit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_format_parses_case_insensitively() {
        assert_eq!("JSON".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("yaml".parse::<LogFormat>().is_err());
        assert_eq!(LogFormat::Json.to_string(), "json");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_ansi(true, None));
        assert!(!use_ansi(false, None), "a file or pipe gets plain text");
        assert!(!use_ansi(true, Some(OsStr::new("1"))), "NO_COLOR wins");
        assert!(
            use_ansi(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_ansi(false, Some(OsStr::new("1"))));
    }
}

//! The experimental feature gate for copying Secrets and ConfigMaps downstream.
//!
//! Read in exactly this one place by hub and agent. Unset or unparseable means off; an
//! unparseable value is returned as an error so the caller can log it once at startup.

/// Environment variable that turns the copy feature on.
pub const COPY_RESOURCES_ENV: &str = "EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM";

/// The gate variable is set to something that is not a boolean; the feature stays off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{COPY_RESOURCES_ENV}={value:?} is not a boolean (use true/false, 1/0, t/f); copying downstream resources stays disabled"
)]
pub struct InvalidGateValue {
    /// The rejected value.
    pub value: String,
}

/// Parses a boolean like Go's `strconv.ParseBool`: `1 t T TRUE true True` and
/// `0 f F FALSE false False`; anything else (including surrounding spaces) is `None`.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Whether copying is enabled for a given gate value (`None` = variable unset = off).
///
/// `Err` means the value is unparseable and the feature is off.
pub fn copy_resources_enabled_from(value: Option<&str>) -> Result<bool, InvalidGateValue> {
    match value {
        None => Ok(false),
        Some(v) => parse_bool(v).ok_or_else(|| InvalidGateValue {
            value: v.to_string(),
        }),
    }
}

/// Whether copying is enabled, from the [`COPY_RESOURCES_ENV`] environment variable.
///
/// `Err` means the value is unparseable (or not UTF-8) and the feature is off.
pub fn copy_resources_enabled() -> Result<bool, InvalidGateValue> {
    match std::env::var(COPY_RESOURCES_ENV) {
        Ok(v) => copy_resources_enabled_from(Some(&v)),
        Err(std::env::VarError::NotPresent) => Ok(false),
        Err(std::env::VarError::NotUnicode(v)) => Err(InvalidGateValue {
            value: v.to_string_lossy().into_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_go_strconv() {
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(copy_resources_enabled_from(Some(v)), Ok(true), "{v}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(copy_resources_enabled_from(Some(v)), Ok(false), "{v}");
        }
    }

    #[test]
    fn unset_is_off() {
        assert_eq!(copy_resources_enabled_from(None), Ok(false));
    }

    #[test]
    fn garbage_is_off_and_reported() {
        for v in ["", "yes", "on", "tRUE", " true", "2"] {
            let err = copy_resources_enabled_from(Some(v)).unwrap_err();
            assert_eq!(err.value, v);
            assert!(err.to_string().contains(COPY_RESOURCES_ENV));
        }
    }
}

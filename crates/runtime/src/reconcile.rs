//! The one error shape and `reason()` vocabulary of every tender reconciler, hub and agent.

use kube::runtime::finalizer;

/// Why one reconciliation (or a controller's start) failed. Messages name the object and
/// what was being done, and never quote Secret data.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// An apiserver request failed.
    #[error("cannot {action}: {source}")]
    Kube {
        /// What was being done, naming the object.
        action: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// An apiserver request about a Secret failed. Only the status reason and code are kept:
    /// the apiserver's message may echo a value.
    #[error("cannot {action}: {reason} ({code})")]
    Redacted {
        /// What was being done, naming the object.
        action: String,
        /// The apiserver's status reason (`Invalid`, `Forbidden`, ...), or the transport error's kind.
        reason: String,
        /// HTTP status code; 0 when no answer came.
        code: u16,
    },
    /// Adding or removing a finalizer failed, or the reconcile inside it did.
    #[error("{object}: {source}")]
    Finalizer {
        /// The object, as `Kind namespace/name`.
        object: String,
        /// What failed.
        #[source]
        source: Box<finalizer::Error<ReconcileError>>,
    },
    /// An object deleted for replacement did not go away in time.
    #[error("{object} is still present after deleting it for replacement")]
    ReplaceTimeout {
        /// The object, as `Kind namespace/name`.
        object: String,
    },
    /// A cache never synced (its watch kept failing).
    #[error("cache of {0} did not sync: its watch was dropped")]
    CacheSync(&'static str),
    /// The process's configuration is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl ReconcileError {
    /// Wraps a client error with what was being done; about a Secret (`secret`), the
    /// apiserver's message is dropped.
    pub fn kube(action: impl Into<String>, secret: bool, source: kube::Error) -> Self {
        let action = action.into();
        if !secret {
            return Self::Kube { action, source };
        }
        match source {
            kube::Error::Api(status) => Self::Redacted {
                action,
                reason: status.reason.clone(),
                code: status.code,
            },
            other => Self::Redacted {
                action,
                reason: transport_reason(&other).to_string(),
                code: 0,
            },
        }
    }

    /// Stable CamelCase reason: the `reason` label of `reconcile_errors_total` in both
    /// binaries, documented in docs/troubleshooting.md.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube { source, .. } if is_too_large(source) => "TooLarge",
            Self::Kube { source, .. } => kube_reason(source),
            Self::Redacted { code: 413, .. } => "TooLarge",
            Self::Redacted { code, .. } => code_reason(*code),
            Self::Finalizer { source, .. } => match source.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.reason(),
                _ => "FinalizerFailed",
            },
            Self::ReplaceTimeout { .. } => "ReplaceTimeout",
            Self::CacheSync(_) => "CacheSync",
            Self::Config(_) => "InvalidConfig",
        }
    }

    /// Whether the apiserver refused to store the object for its size ([`is_too_large`]).
    pub fn is_too_large(&self) -> bool {
        self.reason() == "TooLarge"
    }

    /// Whether the apiserver answered 404.
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::Kube {
                source: kube::Error::Api(s),
                ..
            } => s.code == 404,
            Self::Redacted { code, .. } => *code == 404,
            _ => false,
        }
    }
}

/// Whether the apiserver refused to store an object for its size: 413, or the storage's
/// "request is too large" that kube-apiserver passes on for a server-side apply (a 500).
pub fn is_too_large(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 413
        || s.message.contains("request is too large")
        || s.message.contains("larger than max"))
}

/// The reason word for a client error.
pub fn kube_reason(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(s) => code_reason(s.code),
        _ => "RequestFailed",
    }
}

fn code_reason(code: u16) -> &'static str {
    match code {
        0 => "RequestFailed",
        409 => "Conflict",
        403 => "Forbidden",
        401 => "Unauthorized",
        404 => "NotFound",
        422 => "Invalid",
        429 => "TooManyRequests",
        _ => "ApiError",
    }
}

fn transport_reason(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::HyperError(_) | kube::Error::Service(_) => "RequestFailed",
        _ => "ClientError",
    }
}

/// A client error as text that is safe for status and logs: about a Secret only the reason
/// and code (an apiserver message could quote a value), otherwise the message.
pub fn error_text(error: &kube::Error, secret: bool) -> String {
    match error {
        kube::Error::Api(s) if secret => format!("{} ({})", s.reason, s.code),
        kube::Error::Api(s) => format!("{}: {}", s.reason, s.message),
        other if secret => transport_reason(other).to_string(),
        other => other.to_string(),
    }
}

/// Whether a client error is the apiserver's 404.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                message: message.into(),
                reason: reason.into(),
                code,
                ..Default::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn secret_errors_never_quote_the_server_message() {
        let e = api(422, "Invalid", "data[k]: Invalid value: \"hunter2\"");
        assert_eq!(error_text(&e, true), "Invalid (422)");
        assert!(error_text(&e, false).contains("hunter2"));
        let e = ReconcileError::kube("apply Secret c1/db", true, e);
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
        assert_eq!(e.reason(), "Invalid");
    }

    #[test]
    fn one_vocabulary_for_every_error() {
        let cases = [
            (409, "Conflict"),
            (403, "Forbidden"),
            (404, "NotFound"),
            (422, "Invalid"),
            (500, "ApiError"),
        ];
        for (code, reason) in cases {
            let plain = ReconcileError::kube("x", false, api(code, "R", "m"));
            let secret = ReconcileError::kube("x", true, api(code, "R", "m"));
            assert_eq!(plain.reason(), reason);
            assert_eq!(secret.reason(), reason);
        }
        let nested = ReconcileError::Finalizer {
            object: "Bundle a/b".into(),
            source: Box::new(finalizer::Error::ApplyFailed(ReconcileError::kube(
                "x",
                false,
                api(403, "Forbidden", "no"),
            ))),
        };
        assert_eq!(nested.reason(), "Forbidden");
        assert_eq!(ReconcileError::CacheSync("x").reason(), "CacheSync");
        // Too large for the apiserver's storage: 413, or etcd's limit passed on as a 500.
        let etcd = api(500, "InternalError", "etcdserver: request is too large");
        assert!(is_too_large(&etcd));
        assert_eq!(ReconcileError::kube("x", false, etcd).reason(), "TooLarge");
        assert!(is_too_large(&api(
            413,
            "RequestEntityTooLarge",
            "limit is 3145728"
        )));
        assert_eq!(
            ReconcileError::kube("x", true, api(413, "RequestEntityTooLarge", "m")).reason(),
            "TooLarge"
        );
        assert!(!is_too_large(&api(
            500,
            "InternalError",
            "etcdserver: timeout"
        )));
        assert_eq!(ReconcileError::Config("x".into()).reason(), "InvalidConfig");
    }
}

//! Which failures are worth another request, how long to wait before it, and the errors a
//! failure becomes.

use std::io;
use std::time::Duration;

use object_store::client::{HttpError, HttpErrorKind};
use rand::Rng;

use crate::options::{FIRST_BACKOFF, MAX_BACKOFF};

/// One failed request, classified.
#[derive(Debug)]
pub(crate) struct Fault {
    /// What the caller's error reports (`NotFound`, `PermissionDenied`, `TimedOut`, ...).
    pub(crate) kind: io::ErrorKind,
    /// Whether another request may succeed: throttling, server errors, resets, timeouts,
    /// truncated bodies.
    pub(crate) retry: bool,
    /// What went wrong, on one line (not yet scrubbed of credentials).
    pub(crate) message: String,
}

impl Fault {
    /// A body that ended before the range did: the connection was cut.
    pub(crate) fn truncated(got: u64, want: u64) -> Fault {
        Fault {
            kind: io::ErrorKind::UnexpectedEof,
            retry: true,
            message: format!("the body ended after {got} of {want} bytes"),
        }
    }

    /// A body longer than the range asked for: a server that ignored the range.
    pub(crate) fn overlong(want: u64) -> Fault {
        Fault {
            kind: io::ErrorKind::InvalidData,
            retry: false,
            message: format!("the server sent more than the {want} bytes asked for"),
        }
    }

    /// An object replaced since it was opened: its ETag is no longer the one listed.
    pub(crate) fn changed() -> Fault {
        Fault {
            kind: io::ErrorKind::InvalidData,
            retry: false,
            message: "the object changed while it was read (its ETag no longer matches the one \
                      it had when opened)"
                .into(),
        }
    }

    /// Classifies an `object_store` error.
    pub(crate) fn of(error: &object_store::Error) -> Fault {
        use object_store::Error as E;
        let message = one_line(error);
        let (kind, retry) = match error {
            E::NotFound { .. } => (io::ErrorKind::NotFound, false),
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
                (io::ErrorKind::PermissionDenied, false)
            }
            // The read's `If-Match` failed: the object was replaced since it was opened.
            E::Precondition { .. } => return Fault::changed(),
            E::Generic { .. } => classify_generic(error),
            _ => (io::ErrorKind::Other, false),
        };
        Fault {
            kind,
            retry,
            message,
        }
    }
}

/// A `Generic` error from a store's client: by the HTTP error in its chain (connection,
/// timeout, interrupted or undecodable body: retried), else by the status code its message
/// names (429, 5xx and 408 retried; other 4xx not).
fn classify_generic(error: &object_store::Error) -> (io::ErrorKind, bool) {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(http) = e.downcast_ref::<HttpError>() {
            return match http.kind() {
                HttpErrorKind::Timeout => (io::ErrorKind::TimedOut, true),
                HttpErrorKind::Connect => (io::ErrorKind::ConnectionRefused, true),
                HttpErrorKind::Interrupted | HttpErrorKind::Request | HttpErrorKind::Decode => {
                    (io::ErrorKind::ConnectionReset, true)
                }
                _ => (io::ErrorKind::Other, true),
            };
        }
        cause = e.source();
    }
    match status_in(&error.to_string()) {
        Some(401 | 403) => (io::ErrorKind::PermissionDenied, false),
        Some(404) => (io::ErrorKind::NotFound, false),
        Some(408 | 429) | Some(500..=599) => (io::ErrorKind::Other, true),
        Some(_) => (io::ErrorKind::Other, false),
        // No status and no HTTP error: a failure below HTTP (a reset), worth another try.
        None => (io::ErrorKind::Other, true),
    }
}

/// The status code in `object_store`'s "... status code: 503 Service Unavailable ..." text.
fn status_in(text: &str) -> Option<u16> {
    let (_, after) = text.split_once("status code: ")?;
    after.get(..3)?.parse().ok()
}

/// An error and its causes on one line, the causes only where they add to the text.
pub(crate) fn one_line(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text.replace(['\n', '\r'], " ")
}

/// The wait before retry number `attempt` (1 for the first): [`FIRST_BACKOFF`] doubled for
/// each earlier retry, at most [`MAX_BACKOFF`], drawn uniformly from its upper half.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let full = FIRST_BACKOFF
        .saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    let half = full / 2;
    half + half.mul_f64(rand::rng().random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_decide_retries() {
        let generic = |msg: &str| object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        };
        let retry = |msg: &str| Fault::of(&generic(msg)).retry;
        assert!(retry(
            "Server returned non-2xx status code: 503 Service Unavailable: SlowDown"
        ));
        assert!(retry(
            "Server returned non-2xx status code: 500 Internal Server Error"
        ));
        assert!(retry(
            "Server returned non-2xx status code: 429 Too Many Requests"
        ));
        assert!(!retry(
            "Server returned non-2xx status code: 400 Bad Request"
        ));
        let denied = Fault::of(&generic("non-2xx status code: 403 Forbidden"));
        assert_eq!(
            (denied.kind, denied.retry),
            (io::ErrorKind::PermissionDenied, false)
        );
        let missing = Fault::of(&object_store::Error::NotFound {
            path: "k".into(),
            source: "gone".into(),
        });
        assert_eq!(
            (missing.kind, missing.retry),
            (io::ErrorKind::NotFound, false)
        );
        assert!(Fault::truncated(3, 8).retry && !Fault::overlong(8).retry);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_a_ceiling() {
        for attempt in 1..20 {
            let d = backoff(attempt);
            let full = FIRST_BACKOFF
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(MAX_BACKOFF);
            assert!(d >= full / 2 && d <= full, "{attempt}: {d:?}");
        }
    }
}

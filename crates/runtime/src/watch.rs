//! kube's watcher, with one change: a `410 Gone` re-lists at once.
//!
//! An apiserver that restarted (or compacted its history) no longer holds the resourceVersion
//! a watch resumes from and answers `410 Gone` ("too old resource version"). kube's watcher
//! then re-lists, but it also yields the 410 as an error, and every caller's backoff takes a
//! step on it. After an outage that step is the largest of all (the backoff grew while the
//! apiserver was away, up to 30 s), so a watch that just reconnected waited once more before
//! re-listing — a 60 s hub apiserver outage took 64 s to catch up (`e2e/tests/suite/faults.rs`).
//! A 410 is the apiserver's normal "list again", not a failure: it is dropped here, so the
//! re-list happens on the next poll and the backoff only sees real errors.

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

/// [`kube::runtime::watcher()`] without the `410 Gone` errors (see the module docs).
pub fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    without_gone(watcher::watcher(api, config))
}

/// `stream` without its `410 Gone` watch errors.
pub fn without_gone<S, T>(stream: S) -> impl Stream<Item = watcher::Result<T>> + Send
where
    S: Stream<Item = watcher::Result<T>> + Send,
    T: Send,
{
    stream.filter(|item| {
        let gone = is_gone(item);
        if gone {
            tracing::debug!("watch resourceVersion expired (410); re-listing at once");
        }
        std::future::ready(!gone)
    })
}

/// Whether `item` is the apiserver's `410 Gone` for an expired resourceVersion.
fn is_gone<T>(item: &watcher::Result<T>) -> bool {
    matches!(item, Err(watcher::Error::WatchError(status)) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn status(code: u16) -> watcher::Error {
        let mut s = Status::failure("too old resource version: 684 (742)", "Expired");
        s.code = code;
        watcher::Error::WatchError(Box::new(s))
    }

    #[tokio::test]
    async fn a_410_is_dropped_and_every_other_error_kept() {
        let items: Vec<watcher::Result<u32>> = vec![
            Ok(1),
            Err(status(410)),
            Ok(2),
            Err(status(500)),
            Err(watcher::Error::NoResourceVersion),
            Ok(3),
        ];
        let out: Vec<String> = without_gone(futures::stream::iter(items))
            .map(|i| match i {
                Ok(v) => v.to_string(),
                Err(e) => e.to_string(),
            })
            .collect()
            .await;
        assert_eq!(out.len(), 5, "{out:?}");
        assert_eq!(out[0], "1");
        assert_eq!(out[1], "2");
        assert!(out[2].contains("too old resource version"), "{out:?}");
        assert!(out[3].contains("no metadata.resourceVersion"), "{out:?}");
        assert_eq!(out[4], "3");
    }
}

//! What kube's client hides from the watcher. A watch response that breaks off in the middle
//! (the connection closed or reset mid-stream, even mid-line) is, to kube-client, a quiet end
//! of the watch: it logs `eof in poll` and the watcher resumes from its last resourceVersion,
//! so nothing is lost, but neither the watcher nor we would see an error (other body errors,
//! a read timeout included, kube reports itself). This layer, under the client, observes each
//! watch response's body and reports such a break to its kind's watch loop, which counts and
//! shows it like any other watch error.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::http::{Request, Response, Uri};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use kube::api::ApiResource;
use tokio::sync::mpsc;
use tower::{Layer, Service};

use super::ErrorReason;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type DynBody = dyn Body<Data = Bytes, Error = BoxError> + Send + Unpin;

/// A watch response body that broke off where kube's client does not report it.
#[derive(Debug)]
pub(crate) struct BrokenWatch {
    pub reason: ErrorReason,
    pub error: String,
}

/// Where breaks go: one channel per watched resource, by the path of its all-namespaces
/// watch (`/api/v1/pods`, `/apis/networking.istio.io/v1/serviceentries`).
#[derive(Clone, Default)]
pub(crate) struct WatchBreaks(Arc<Mutex<HashMap<String, mpsc::UnboundedSender<BrokenWatch>>>>);

impl WatchBreaks {
    /// The breaks of `resource`'s watches, from now on.
    pub fn register(&self, resource: &ApiResource) -> mpsc::UnboundedReceiver<BrokenWatch> {
        let path = if resource.group.is_empty() {
            format!("/api/{}/{}", resource.version, resource.plural)
        } else {
            format!(
                "/apis/{}/{}/{}",
                resource.group, resource.version, resource.plural
            )
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().insert(path, tx);
        rx
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::UnboundedSender<BrokenWatch>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sender_for(&self, uri: &Uri) -> Option<mpsc::UnboundedSender<BrokenWatch>> {
        let watching = uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        if !watching {
            return None;
        }
        self.lock().get(uri.path()).cloned()
    }
}

impl<S> Layer<S> for WatchBreaks {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            breaks: self.clone(),
        }
    }
}

/// The client's service, with watch bodies observed.
#[derive(Clone)]
pub(crate) struct Observed<S> {
    inner: S,
    breaks: WatchBreaks,
}

type ObservedFuture<E> =
    Pin<Box<dyn Future<Output = Result<Response<Box<DynBody>>, E>> + Send + 'static>>;

impl<S, B> Service<Request<B>> for Observed<S>
where
    S: Service<Request<B>, Response = Response<Box<DynBody>>>,
    S::Future: Send + 'static,
{
    type Response = Response<Box<DynBody>>;
    type Error = S::Error;
    type Future = ObservedFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let report = self.breaks.sender_for(request.uri());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match report {
                Some(report) => response.map(|inner| {
                    Box::new(ObservedBody {
                        inner,
                        report: Some(report),
                    }) as Box<DynBody>
                }),
                None => response,
            })
        })
    }
}

struct ObservedBody {
    inner: Box<DynBody>,
    report: Option<mpsc::UnboundedSender<BrokenWatch>>,
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut *self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(error))) = &polled
            && let Some(reason) = swallowed(error.as_ref())
            && let Some(report) = self.report.take()
        {
            let _ = report.send(BrokenWatch {
                reason,
                error: format!("the watch broke off: {error}"),
            });
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether kube's client ends a watch quietly on `error`: as it decides (kube-client's
/// `request_events`), an I/O error of kind `UnexpectedEof` anywhere in the chain, or a chunk
/// decoder's "unexpected EOF during chunk". Every other error it reports itself.
fn swallowed(error: &(dyn std::error::Error + 'static)) -> Option<ErrorReason> {
    if error.to_string().contains("unexpected EOF during chunk") {
        return Some(ErrorReason::Connection);
    }
    let mut stack: Vec<&(dyn std::error::Error + 'static)> = vec![error];
    // Bounded, in case a `source` chain cycles.
    for _ in 0..32 {
        let Some(e) = stack.pop() else { break };
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::UnexpectedEof {
                return Some(ErrorReason::Connection);
            }
            if let Some(inner) = io.get_ref() {
                stack.push(inner);
            }
        }
        stack.extend(e.source());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eof_mid_stream_is_what_kube_swallows() {
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "mid-chunk");
        assert_eq!(
            swallowed(&std::io::Error::other(eof)),
            Some(ErrorReason::Connection)
        );
        let chunk = std::io::Error::other("unexpected EOF during chunk size line");
        assert_eq!(swallowed(&chunk), Some(ErrorReason::Connection));
        // kube reports these itself: counting them here would count them twice.
        let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out");
        assert_eq!(swallowed(&std::io::Error::other(timeout)), None);
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(swallowed(&reset), None);
    }

    #[test]
    fn only_watches_of_registered_resources_are_observed() {
        let breaks = WatchBreaks::default();
        let pods = ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
        };
        let _rx = breaks.register(&pods);
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert!(
            breaks
                .sender_for(&uri("/api/v1/pods?watch=true&resourceVersion=7"))
                .is_some()
        );
        assert!(breaks.sender_for(&uri("/api/v1/pods?limit=500")).is_none());
        assert!(
            breaks
                .sender_for(&uri("/api/v1/services?watch=true"))
                .is_none()
        );
    }
}

//! A connection's outbound queue: the responses waiting for the gRPC encoder to take them.
//!
//! It holds at most [`QUEUE`] response. A connection asks for a [`Slot`] *before* it computes
//! what to send, so while a proxy is slow nothing is computed, and when it reads again it gets
//! the difference to the newest snapshot (one response per type, each resource once, at its
//! latest version), never a backlog of superseded ones. The queue counts the bytes it holds so
//! the debug views (and tests) can see that a stuck proxy's memory stays bounded.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::{Notify, mpsc};
use tonic::Status;

/// Responses queued per stream beyond the one the encoder is writing.
pub const QUEUE: usize = 1;

/// A response already framed as a gRPC message ([`crate::push::response`]). Boxed: tokio's
/// channel allocates a block of 32 slots up front, 32 × the item's size per stream for a queue
/// that holds one.
type Item = Box<Bytes>;

/// The sending half, owned by the connection task.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Item>,
    shared: Arc<Shared>,
}

/// The receiving half: the response stream tonic encodes.
pub struct Responses {
    rx: mpsc::Receiver<Item>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    queued_bytes: AtomicUsize,
    /// The status the stream ends with once the queue is drained and closed (OK when unset).
    /// Set apart from the queue, so a full queue never loses it.
    /// Boxed: most streams never set it.
    ending: Mutex<Option<Box<Status>>>,
    /// Set once the encoder has taken the stream's end (or the receiver is gone).
    finished: AtomicBool,
    finish: Notify,
}

impl Shared {
    fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        self.finish.notify_waiters();
    }
}

/// Waits for the encoder to take the stream's end: see [`Outbound::drained`].
pub struct Drained(Arc<Shared>);

impl Drained {
    pub async fn wait(self) {
        loop {
            let notified = self.0.finish.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.finished.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// The receiver is gone (the stream ended).
#[derive(Debug, thiserror::Error)]
#[error("the response stream is closed")]
pub struct Closed;

/// Room for one response.
pub struct Slot {
    permit: mpsc::OwnedPermit<Item>,
    shared: Arc<Shared>,
}

/// A queue of [`QUEUE`] responses.
pub fn queue() -> (Outbound, Responses) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let shared = Arc::new(Shared::default());
    (
        Outbound {
            tx,
            shared: shared.clone(),
        },
        Responses { rx, shared },
    )
}

impl Outbound {
    /// Waits until the queue has room.
    pub async fn reserve(&self) -> Result<Slot, Closed> {
        let permit = self.tx.clone().reserve_owned().await.map_err(|_| Closed)?;
        Ok(Slot {
            permit,
            shared: self.shared.clone(),
        })
    }

    /// Something to wait on, after every sender is dropped, until the encoder has taken the
    /// stream's end. The connection keeps the request stream open until then: hyper resets a
    /// stream whose request body is dropped first (`NO_ERROR`), and the client would see the
    /// stream end without its status.
    pub fn drained(&self) -> Drained {
        Drained(self.shared.clone())
    }

    /// Sets the status the stream ends with, after the responses already queued, once every
    /// sender is dropped.
    pub fn end_with(&self, status: Status) {
        *self.shared.ending.lock().expect("not poisoned") = Some(Box::new(status));
    }

    /// Responses waiting for the encoder (0 or 1).
    pub fn queued(&self) -> usize {
        QUEUE - self.tx.capacity()
    }

    /// Encoded bytes of the responses waiting for the encoder.
    pub fn queued_bytes(&self) -> usize {
        self.shared.queued_bytes.load(Ordering::Relaxed)
    }
}

impl Slot {
    /// Queues a response, framed ([`crate::push::response::Outgoing::frame`]).
    pub fn send(self, frame: Bytes) {
        self.shared
            .queued_bytes
            .fetch_add(frame.len(), Ordering::Relaxed);
        self.permit.send(Box::new(frame));
    }
}

impl Stream for Responses {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                self.shared
                    .queued_bytes
                    .fetch_sub(frame.len(), Ordering::Relaxed);
                Poll::Ready(Some(Ok(*frame)))
            }
            Poll::Ready(None) => {
                let ending = self.shared.ending.lock().expect("not poisoned").take();
                self.shared.finish();
                Poll::Ready(ending.map(|status| Err(*status)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Responses {
    fn drop(&mut self) {
        self.shared.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn response(nonce: &str, payload: usize) -> Bytes {
        let mut frame = nonce.as_bytes().to_vec();
        frame.resize(payload.max(nonce.len()), b'x');
        Bytes::from(frame)
    }

    #[tokio::test]
    async fn holds_one_response_and_counts_its_bytes() {
        let (outbound, mut responses) = queue();
        outbound.reserve().await.unwrap().send(response("1", 1000));
        assert_eq!(outbound.queued(), 1);
        assert_eq!(outbound.queued_bytes(), 1000);
        // Full: no second slot until the encoder takes the first.
        let second = tokio::time::timeout(std::time::Duration::from_millis(50), outbound.reserve());
        assert!(second.await.is_err(), "a second response was queued");
        let first = responses.next().await.unwrap().unwrap();
        assert!(first.starts_with(b"1"));
        assert_eq!((outbound.queued(), outbound.queued_bytes()), (0, 0));
        outbound.reserve().await.unwrap().send(response("2", 10));
        assert_eq!(outbound.queued(), 1);
        drop(responses);
        assert!(outbound.reserve().await.is_err());
    }

    #[tokio::test]
    async fn the_ending_status_follows_the_queued_response_even_when_the_queue_is_full() {
        let (outbound, mut responses) = queue();
        outbound.reserve().await.unwrap().send(response("1", 10));
        // The queue is full, and the status is still kept.
        outbound.end_with(Status::unavailable("transport is closing"));
        let drained = outbound.drained();
        drop(outbound);
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            outbound_drained(&drained),
        );
        assert!(early.await.is_err(), "drained before the status was taken");
        assert!(responses.next().await.unwrap().unwrap().starts_with(b"1"));
        let status = responses.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        drained.wait().await;
        assert_eq!(status.message(), "transport is closing");
        assert!(responses.next().await.is_none());
    }

    async fn outbound_drained(drained: &Drained) {
        Drained(drained.0.clone()).wait().await
    }

    #[tokio::test]
    async fn without_an_ending_status_the_stream_just_ends() {
        let (outbound, mut responses) = queue();
        let drained = outbound.drained();
        drop(outbound);
        assert!(responses.next().await.is_none());
        drained.wait().await;
        // Dropping the receiver also counts.
        let (outbound, responses) = queue();
        drop(responses);
        outbound.drained().wait().await;
    }
}

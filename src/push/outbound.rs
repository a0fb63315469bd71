//! A connection's outbound queue: the responses waiting for the gRPC encoder to take them.
//!
//! It holds at most [`QUEUE`] response. A connection asks for a [`Slot`] *before* it computes
//! what to send, so while a proxy is slow nothing is computed, and when it reads again it gets
//! the difference to the newest snapshot (one response per type, each resource once, at its
//! latest version), never a backlog of superseded ones. The queue counts the bytes it holds so
//! the debug views (and tests) can see that a stuck proxy's memory stays bounded.
//!
//! A response arrives in pieces ([`crate::push::response::Outgoing::pieces`]), and the encoder
//! takes one piece at a time: HTTP/2 then holds only the piece it writes and the next, and the
//! rest of the response stays here, where [`Outbound::abandon`] drops it when a proxy that
//! reads nothing is dropped.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::{Notify, mpsc};
use tonic::Status;

/// Responses queued per stream beyond the one the encoder is writing.
pub const QUEUE: usize = 1;

/// A response already framed as a gRPC message, in pieces ([`crate::push::response`]).
/// Boxed: tokio's channel allocates a block of 32 slots up front, 32 × the item's size per
/// stream for a queue that holds one.
type Item = Box<Vec<Bytes>>;

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
    /// The pieces of the response the encoder is taking, not yet taken.
    current: Mutex<VecDeque<Bytes>>,
    /// Set by [`Outbound::abandon`]: the stream ends with an error instead of going on.
    abandoned: AtomicBool,
    /// Pieces the encoder has taken: it takes the next only once HTTP/2 has room for it, so
    /// this moves only while the proxy reads.
    taken: AtomicU64,
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

    /// Drops what the encoder has not taken (the rest of the response it is writing), for a
    /// stream given up on because its proxy reads nothing: only what HTTP/2 already holds (two
    /// pieces at most) stays until the connection goes. If the encoder is ever polled again,
    /// the stream ends with an error rather than a truncated message followed by more. A
    /// response still in the queue stays until then (it is one, and usually small).
    pub fn abandon(&self) {
        self.shared.abandoned.store(true, Ordering::Release);
        let dropped: usize =
            std::mem::take(&mut *self.shared.current.lock().expect("not poisoned"))
                .iter()
                .map(Bytes::len)
                .sum();
        self.shared
            .queued_bytes
            .fetch_sub(dropped, Ordering::Relaxed);
    }

    /// How many pieces the encoder has taken so far: a count that moves only while the proxy
    /// reads (HTTP/2 takes a piece only with room in the proxy's window for the one before).
    pub fn taken(&self) -> u64 {
        self.shared.taken.load(Ordering::Relaxed)
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
    /// Queues a response, framed in pieces ([`crate::push::response::Outgoing::pieces`]).
    pub fn send(self, pieces: Vec<Bytes>) {
        let bytes: usize = pieces.iter().map(Bytes::len).sum();
        self.shared.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.permit.send(Box::new(pieces));
    }
}

impl Stream for Responses {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.shared.abandoned.load(Ordering::Acquire) {
            self.shared.finish();
            return Poll::Ready(Some(Err(Status::unavailable(
                "the stream was dropped: the proxy read nothing for the idle timeout",
            ))));
        }
        loop {
            let piece = self
                .shared
                .current
                .lock()
                .expect("not poisoned")
                .pop_front();
            if let Some(piece) = piece {
                self.shared.taken.fetch_add(1, Ordering::Relaxed);
                self.shared
                    .queued_bytes
                    .fetch_sub(piece.len(), Ordering::Relaxed);
                return Poll::Ready(Some(Ok(piece)));
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(pieces)) => {
                    *self.shared.current.lock().expect("not poisoned") = VecDeque::from(*pieces);
                }
                Poll::Ready(None) => return self.end(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Responses {
    /// Every sender is gone and the queue is drained: the ending status, if any.
    fn end(&mut self) -> Poll<Option<Result<Bytes, Status>>> {
        let ending = self.shared.ending.lock().expect("not poisoned").take();
        self.shared.finish();
        Poll::Ready(ending.map(|status| Err(*status)))
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

    fn response(nonce: &str, payload: usize) -> Vec<Bytes> {
        let mut frame = nonce.as_bytes().to_vec();
        frame.resize(payload.max(nonce.len()), b'x');
        vec![Bytes::from(frame)]
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
    async fn pieces_are_taken_one_at_a_time_and_abandon_drops_the_rest() {
        let (outbound, mut responses) = queue();
        let pieces: Vec<Bytes> = (0..4).map(|i| Bytes::from(vec![i as u8; 1000])).collect();
        outbound.reserve().await.unwrap().send(pieces);
        assert_eq!(outbound.queued_bytes(), 4000);
        let first = responses.next().await.unwrap().unwrap();
        assert_eq!(first[..], [0u8; 1000][..]);
        assert_eq!(outbound.taken(), 1);
        // The response left the queue (a slot is free) but three pieces wait here.
        assert_eq!((outbound.queued(), outbound.queued_bytes()), (0, 3000));
        assert_eq!(responses.next().await.unwrap().unwrap()[0], 1);
        outbound.abandon();
        assert_eq!(outbound.queued_bytes(), 0);
        // Polled again, the stream ends with an error, never the next response's bytes.
        outbound.reserve().await.unwrap().send(response("9", 10));
        let status = responses.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
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

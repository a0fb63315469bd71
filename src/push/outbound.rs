//! A connection's outbound queue: the responses waiting for the gRPC encoder to take them.
//!
//! It holds at most [`QUEUE`] response. A connection asks for a [`Slot`] *before* it computes
//! what to send, so while a proxy is slow nothing is computed, and when it reads again it gets
//! the difference to the newest snapshot (one response per type, each resource once, at its
//! latest version), never a backlog of superseded ones. The queue counts the bytes it holds so
//! the debug views (and tests) can see that a stuck proxy's memory stays bounded.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;
use tonic::Status;

/// Responses queued per stream beyond the one the encoder is writing.
pub const QUEUE: usize = 1;

/// A response already framed as a gRPC message ([`crate::push::response`]), or the status that
/// ends the stream. Boxed: tokio's channel allocates a block of 32 slots up front, 32 × the
/// item's size per stream for a queue that holds one.
type Item = Box<Result<Bytes, Status>>;

/// The sending half, owned by the connection task.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Item>,
    queued_bytes: Arc<AtomicUsize>,
}

/// The receiving half: the response stream tonic encodes.
pub struct Responses {
    rx: mpsc::Receiver<Item>,
    queued_bytes: Arc<AtomicUsize>,
}

/// The receiver is gone (the stream ended).
#[derive(Debug, thiserror::Error)]
#[error("the response stream is closed")]
pub struct Closed;

/// Room for one response.
pub struct Slot {
    permit: mpsc::OwnedPermit<Item>,
    queued_bytes: Arc<AtomicUsize>,
}

/// A queue of [`QUEUE`] responses.
pub fn queue() -> (Outbound, Responses) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let queued_bytes = Arc::new(AtomicUsize::new(0));
    (
        Outbound {
            tx,
            queued_bytes: queued_bytes.clone(),
        },
        Responses { rx, queued_bytes },
    )
}

impl Outbound {
    /// Waits until the queue has room.
    pub async fn reserve(&self) -> Result<Slot, Closed> {
        let permit = self.tx.clone().reserve_owned().await.map_err(|_| Closed)?;
        Ok(Slot {
            permit,
            queued_bytes: self.queued_bytes.clone(),
        })
    }

    /// Responses waiting for the encoder (0 or 1).
    pub fn queued(&self) -> usize {
        QUEUE - self.tx.capacity()
    }

    /// Encoded bytes of the responses waiting for the encoder.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes.load(Ordering::Relaxed)
    }
}

impl Slot {
    /// Queues a response, framed ([`crate::push::response::Outgoing::frame`]).
    pub fn send(self, frame: Bytes) {
        self.queued_bytes.fetch_add(frame.len(), Ordering::Relaxed);
        self.permit.send(Box::new(Ok(frame)));
    }

    /// Queues the status that ends the stream.
    pub fn fail(self, status: Status) {
        self.permit.send(Box::new(Err(status)));
    }
}

impl Stream for Responses {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(boxed)) => {
                if let Ok(frame) = &*boxed {
                    self.queued_bytes.fetch_sub(frame.len(), Ordering::Relaxed);
                }
                Poll::Ready(Some(*boxed))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
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
}

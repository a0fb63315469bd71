//! Faults the fake injects, each imitating what a real API server (or the network in front of
//! it) does:
//!
//! - **Failing calls by verb** ([`FakeApiServer::fail_calls`]): the next `count` lists (or
//!   watches, gets, patches...) of a resource answer an error status instead. A 500 is the
//!   API server's `InternalError` (an etcd hiccup, a webhook down); a 429 is API priority and
//!   fairness shedding load (`TooManyRequests`, with `Retry-After: 1`), a 503 an apiserver
//!   behind a load balancer that is restarting (`ServiceUnavailable`, `Retry-After: 1`). Unlike
//!   [`FakeApiServer::fail_requests`] this tells a list from a watch (both are `GET`).
//! - **Hanging calls** ([`FakeApiServer::hang`]): a matching list is accepted and not
//!   answered, a matching watch answers its headers and then sends nothing (a half-dead
//!   connection, an apiserver stuck on etcd), until the hang is lifted; only the client's own
//!   timeouts get it out.
//! - **A watch cut mid-event** ([`FakeApiServer::cut_next_watch_event`]): the next event a
//!   watch of the resource would send goes out half written (the connection dies in the
//!   middle of a JSON line), then the connection is reset.
//! - **A slow TokenReview** ([`FakeApiServer::delay_token_reviews`]); a failing one is
//!   `fail_requests("POST", "tokenreviews", n, 500)`.
//! - **A concurrent writer** ([`FakeApiServer::interpose_write`]): just before the next
//!   matching write is handled, another client's change to the object lands (a new
//!   resourceVersion), so a write made from an earlier read meets the real optimistic
//!   concurrency 409.
//!
//! 410 Gone after compaction, outages and dropped watches are in the module root.

use super::*;

/// Which calls a fault applies to: an RBAC verb (`list`, `watch`, `get`, `patch`...) on a
/// resource (its plural).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Calls {
    verb: String,
    plural: String,
}

impl Calls {
    fn matches(&self, request: &Request) -> bool {
        request
            .api_call()
            .is_some_and(|c| c.verb == self.verb && c.resource == self.plural)
    }
}

/// The faults in force.
#[derive(Default)]
pub(super) struct Faults {
    /// (calls, remaining, status code).
    failing: Vec<(Calls, usize, u16)>,
    hanging: Vec<Calls>,
    /// Plurals whose next watch event is cut in half.
    cut: Vec<String>,
    token_review_delay: Duration,
    /// (method, plural, the other writer's object) applied before the next such write.
    interposed: Vec<(String, String, Value)>,
}

impl FakeState {
    /// Consumes a verb failure matching `request`, if any.
    pub(super) fn take_call_failure(&mut self, request: &Request) -> Option<u16> {
        let (_, remaining, code) = self
            .faults
            .failing
            .iter_mut()
            .find(|(calls, remaining, _)| *remaining > 0 && calls.matches(request))?;
        *remaining -= 1;
        Some(*code)
    }

    pub(super) fn hangs(&self, request: &Request) -> bool {
        self.faults.hanging.iter().any(|c| c.matches(request))
    }

    /// True once for the next watch event of `plural` after [`FakeApiServer::cut_next_watch_event`].
    pub(super) fn take_cut(&mut self, plural: &str) -> bool {
        match self.faults.cut.iter().position(|p| p == plural) {
            Some(i) => {
                self.faults.cut.remove(i);
                true
            }
            None => false,
        }
    }

    pub(super) fn token_review_delay(&self) -> Duration {
        self.faults.token_review_delay
    }

    /// The other writer's object to store before `request`, if one waits for it.
    pub(super) fn take_interposed(&mut self, request: &Request) -> Option<Value> {
        let plural = request.api_call()?.resource;
        let i = self
            .faults
            .interposed
            .iter()
            .position(|(method, p, _)| *method == request.method && *p == plural)?;
        Some(self.faults.interposed.remove(i).2)
    }
}

impl Shared {
    /// Waits while `request` matches a hang; true if it did hang.
    pub(super) async fn hang_while_faulty(&self, request: &Request) -> bool {
        if !self.lock().hangs(request) {
            return false;
        }
        let mut released = self.released.subscribe();
        loop {
            if !self.lock().hangs(request) {
                return true;
            }
            if released.changed().await.is_err() {
                return true;
            }
        }
    }
}

impl FakeApiServer {
    /// The next `count` calls with RBAC verb `verb` (`list`, `watch`, `get`, `patch`, ...) on
    /// `plural` answer `code` (500, 503, 429...) without effect.
    pub fn fail_calls(&self, verb: &str, plural: &str, count: usize, code: u16) {
        let calls = Calls {
            verb: verb.into(),
            plural: plural.into(),
        };
        self.shared.lock().faults.failing.push((calls, count, code));
    }

    /// Stops every injected verb failure that is still pending.
    pub fn clear_call_failures(&self) {
        self.shared.lock().faults.failing.clear();
    }

    /// While `on`, `verb` calls (`list` or `watch`) on `plural` hang: a list is never
    /// answered, a watch sends its headers and then nothing. Lifting the hang lets a parked
    /// list answer (late, if its client still waits) and resets a parked watch's connection.
    pub fn hang(&self, verb: &str, plural: &str, on: bool) {
        let calls = Calls {
            verb: verb.into(),
            plural: plural.into(),
        };
        {
            let mut state = self.shared.lock();
            state.faults.hanging.retain(|c| *c != calls);
            if on {
                state.faults.hanging.push(calls);
            }
        }
        self.shared.released.send_modify(|n| *n += 1);
    }

    /// The next event any watch of `plural` sends is cut in the middle of its JSON line and
    /// the connection reset.
    pub fn cut_next_watch_event(&self, plural: &str) {
        self.shared.lock().faults.cut.push(plural.into());
    }

    /// TokenReviews are answered only after `delay` (zero: at once).
    pub fn delay_token_reviews(&self, delay: Duration) {
        self.shared.lock().faults.token_review_delay = delay;
    }

    /// Just before the next `method` (PATCH, PUT...) on `plural` is handled, `object` is
    /// stored as another client's write would store it (a new resourceVersion, watches told).
    pub fn interpose_write(&self, method: &str, plural: &str, object: Value) {
        self.shared
            .lock()
            .faults
            .interposed
            .push((method.into(), plural.into(), object));
    }
}

/// A 200 watch response that sends nothing until the hang on `request` is lifted, then
/// resets the connection.
pub(super) fn silent_watch(shared: Arc<Shared>, request: Request) -> Response {
    let body = futures::stream::once(async move {
        shared.hang_while_faulty(&request).await;
        Err::<Bytes, io::Error>(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "hang lifted",
        ))
    });
    (
        [("content-type", "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}

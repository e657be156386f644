//! Lanes: where a store's requests run. A reading thread takes a lane (a tokio runtime on the
//! calling thread, and an HTTP client with a connection pool of its own) for one read, drives
//! it until the read's requests are done, and gives it back. The connections' socket reads,
//! the body's chunks and their copies into the slot all happen on the reading thread, which
//! hands nothing to another thread and waits on nothing but its sockets. A shared
//! multi-thread runtime would hand every chunk from its threads to the waiting reader, a
//! context switch each, for more CPU time a GB and no faster reads (docs/BENCHMARKS.md,
//! "Object storage").
//!
//! A connection belongs to the runtime that opened it and makes progress only while that
//! runtime runs, so connections are never shared between lanes: `object_store` makes its HTTP
//! client through [`LaneConnector`], whose service sends each request with the client of the
//! lane running on the calling thread.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use object_store::ClientOptions;

thread_local! {
    /// The lane this thread is driving, while it drives one.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// A runtime that runs only on the thread blocked on it.
#[derive(Debug)]
struct Lane {
    id: usize,
    runtime: tokio::runtime::Runtime,
}

/// The lanes of one store: as many as threads have read from it at once, each reused by the
/// next read.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    idle: Mutex<Vec<Lane>>,
    made: AtomicUsize,
}

/// Marks the calling thread as driving a lane until dropped (a panic included).
struct Driving(Option<usize>);

impl Driving {
    fn new(id: usize) -> Driving {
        Driving(CURRENT.replace(Some(id)))
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        CURRENT.set(self.0);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Lanes {
    /// Runs `future` to completion on an idle lane (a new one when every lane is taken); an
    /// error only when a new lane's runtime could not be made.
    pub(crate) fn block_on<F: Future>(&self, future: F) -> std::io::Result<F::Output> {
        let popped = lock(&self.idle).pop();
        let lane = match popped {
            Some(lane) => lane,
            None => Lane {
                runtime: tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?,
                id: self.made.fetch_add(1, Ordering::Relaxed),
            },
        };
        let out = {
            let _driving = Driving::new(lane.id);
            lane.runtime.block_on(async {
                settle().await;
                future.await
            })
        };
        lock(&self.idle).push(lane);
        Ok(out)
    }
}

/// Lets the lane's connections see what happened while the lane was idle before a request
/// takes one. The block-on future yields twice: after the first, the runtime polls its I/O
/// driver without blocking, which wakes the connections whose sockets the server closed, and
/// then polls the block-on future again before the tasks it woke; after the second those tasks
/// have run, so a closed connection has left the pool rather than carrying the request and
/// failing. The first yield also runs what the last read left queued, such as handing its
/// connections back to the pool, which the next request would otherwise not find. Without it,
/// the test whose server closes connections while the readers wait retried nine reads. It
/// relies on `yield_now` deferring the wake until the driver was polled (tokio 1.54 and
/// later); a connection dropped silently (no FIN, as some NATs do) still fails once and is
/// retried.
async fn settle() {
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
}

/// Makes `object_store`'s HTTP client: one that sends each request with the client of the
/// lane running on the calling thread.
#[derive(Debug, Default)]
pub(crate) struct LaneConnector;

impl HttpConnector for LaneConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        // Lane 0's client is made now, so that options reqwest refuses fail when the store is
        // built, as with object_store's own connector, rather than at the first request.
        let first = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(LaneService {
            options: options.clone(),
            clients: Mutex::new(vec![Some(first)]),
        }))
    }
}

/// `reqwest` clients made with one set of options, one per lane (index: the lane's id).
#[derive(Debug)]
struct LaneService {
    options: ClientOptions,
    clients: Mutex<Vec<Option<HttpClient>>>,
}

impl LaneService {
    fn client(&self) -> Result<HttpClient, HttpError> {
        let Some(id) = CURRENT.get() else {
            // Every request of this crate runs inside `Lanes::block_on`; one outside would
            // open connections that no lane drives.
            return Err(HttpError::new(
                HttpErrorKind::Unknown,
                std::io::Error::other("pinfeed-store: an HTTP request outside a lane"),
            ));
        };
        if let Some(Some(client)) = lock(&self.clients).get(id) {
            return Ok(client.clone());
        }
        // Made outside the lock (its TLS set-up takes milliseconds while other lanes read);
        // only this thread drives lane `id`, so no other thread fills its place meanwhile.
        let made = ReqwestConnector::default()
            .connect(&self.options)
            .map_err(|e| HttpError::new(HttpErrorKind::Unknown, e))?;
        let mut clients = lock(&self.clients);
        if clients.len() <= id {
            clients.resize(id + 1, None);
        }
        Ok(clients[id].get_or_insert(made).clone())
    }
}

#[async_trait::async_trait]
impl HttpService for LaneService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        self.client()?.execute(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_at_once_take_lanes_of_their_own_and_later_reads_reuse_them() {
        let lanes = Lanes::default();
        let both_inside = std::sync::Barrier::new(2);
        let ids: Vec<usize> = std::thread::scope(|s| {
            let read = || {
                lanes
                    .block_on(async {
                        both_inside.wait();
                        CURRENT.get().expect("inside a lane")
                    })
                    .unwrap()
            };
            let threads: Vec<_> = (0..2).map(|_| s.spawn(read)).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_ne!(ids[0], ids[1]);
        for _ in 0..3 {
            let id = lanes.block_on(async { CURRENT.get() }).unwrap();
            assert!(
                id.is_some_and(|id| ids.contains(&id)),
                "{id:?} not in {ids:?}"
            );
        }
        assert_eq!(lanes.made.load(Ordering::Relaxed), 2);
        assert_eq!(
            CURRENT.get(),
            None,
            "the thread still marked as driving a lane"
        );
    }
}

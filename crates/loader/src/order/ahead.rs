//! Orders drawn ahead. A shuffled epoch's permutation is drawn by Fisher–Yates over every
//! record, serially (1.49 million records: 5-9 ms on the 2-core development machine), and a
//! pass cannot read its first batch before it is made. So when a plan takes the order of an
//! epoch, the order of the epoch after it is drawn on a thread of its own while this one runs,
//! and kept here, where the next epoch of the same plan, or the next pass (Python starts each
//! iteration as a new loader), finds it made.
//!
//! Bounded: [`KEPT`] orders over all loaders of the process, and only tables of at most
//! [`AHEAD_MAX_BYTES`]; larger orders are drawn when needed, as every order was before.
//!
//! Never waited for across a `fork`: the kept orders' lock is only tried (a lock held by a
//! thread the child does not have is passed by, and the order drawn), and a child does not
//! take its parent's orders (one may be half drawn by a thread the child does not have).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

use super::{EpochOrder, OrderSpec, Shuffle};
use crate::error::Result;

/// Orders kept: the current and the next of two loaders at once (a training and an
/// evaluation loader, say).
const KEPT: usize = 4;

/// The largest permutation drawn ahead, in bytes of its table (4 bytes a record up to 2³²
/// records): 64 MiB, 16 Mi records.
pub(crate) const AHEAD_MAX_BYTES: u64 = 64 << 20;

/// An order being drawn or drawn: `None` inside where drawing it failed (drawn again by the
/// caller, for its error).
type Cell = Arc<OnceLock<Option<Arc<EpochOrder>>>>;

struct Kept {
    /// The process that kept it.
    pid: u32,
    spec: OrderSpec,
    epoch: u64,
    consumed: u64,
    cell: Cell,
}

static ORDERS: Mutex<VecDeque<Kept>> = Mutex::new(VecDeque::new());

/// Whether orders of `spec` are drawn ahead: random shuffles (block orders are drawn window by
/// window as they are read, the identity costs nothing) within [`AHEAD_MAX_BYTES`].
pub(crate) fn drawn_ahead(spec: &OrderSpec) -> bool {
    spec.shuffle == Shuffle::Random && spec.num_records.saturating_mul(4) <= AHEAD_MAX_BYTES
}

/// The kept orders, or `None` if their lock stays taken (by a thread that did not follow a
/// `fork` into this process: every other holder lets go within a few instructions).
fn kept() -> Option<MutexGuard<'static, VecDeque<Kept>>> {
    for _ in 0..1000 {
        match ORDERS.try_lock() {
            Ok(kept) => return Some(kept),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// The cell of `(spec, epoch, consumed)`, made (and the oldest let go past [`KEPT`]) if new;
/// `None` where the kept orders cannot be had ([`kept`]).
fn cell(spec: &OrderSpec, epoch: u64, consumed: u64) -> Option<Cell> {
    let mut kept = kept()?;
    let pid = std::process::id();
    kept.retain(|k| k.pid == pid);
    if let Some(k) = kept
        .iter()
        .find(|k| k.epoch == epoch && k.consumed == consumed && k.spec == *spec)
    {
        return Some(Arc::clone(&k.cell));
    }
    let cell = Cell::default();
    kept.push_back(Kept {
        pid,
        spec: spec.clone(),
        epoch,
        consumed,
        cell: Arc::clone(&cell),
    });
    while kept.len() > KEPT {
        kept.pop_front();
    }
    Some(cell)
}

fn draw(spec: &OrderSpec, epoch: u64, consumed: u64) -> Result<Arc<EpochOrder>> {
    EpochOrder::remainder(spec, epoch, consumed).map(Arc::new)
}

/// The order of `epoch` for `spec` (the rest after `consumed` records, as
/// [`EpochOrder::remainder`]): the one drawn ahead when there is one (waiting for it if it is
/// being drawn), else drawn now.
pub(crate) fn order(spec: &OrderSpec, epoch: u64, consumed: u64) -> Result<Arc<EpochOrder>> {
    let Some(cell) = drawn_ahead(spec)
        .then(|| cell(spec, epoch, consumed))
        .flatten()
    else {
        return draw(spec, epoch, consumed);
    };
    match cell.get_or_init(|| draw(spec, epoch, consumed).ok()) {
        Some(order) => Ok(Arc::clone(order)),
        None => draw(spec, epoch, consumed),
    }
}

/// Starts drawing the order of `epoch` for `spec` (from its start) on a thread of its own,
/// where [`drawn_ahead`] and it is not kept already. Nothing waits for it: a plan that needs
/// the order before it is made waits in [`order`], or draws it itself if the thread could not
/// start.
pub(crate) fn draw_ahead(spec: &OrderSpec, epoch: u64) {
    let Some(cell) = drawn_ahead(spec).then(|| cell(spec, epoch, 0)).flatten() else {
        return;
    };
    if cell.get().is_some() {
        return;
    }
    let spec = spec.clone();
    // A thread that cannot start leaves the cell empty: `order` draws it then.
    let _ = std::thread::Builder::new()
        .name("pinfeed-order".into())
        .spawn(move || {
            cell.get_or_init(|| draw(&spec, epoch, 0).ok());
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(num_records: u64, seed: u64) -> OrderSpec {
        OrderSpec {
            num_records,
            batch_size: 7,
            drop_last: false,
            shuffle: Shuffle::Random,
            seed,
            rank: 1,
            world_size: 3,
        }
    }

    fn batches(order: &EpochOrder) -> Vec<crate::BatchRecords> {
        (0..order.num_batches()).map(|i| order.batch(i)).collect()
    }

    #[test]
    fn an_order_drawn_ahead_is_the_order_of_its_epoch() {
        // Seeds of this test only: the kept orders are shared by the whole process.
        let s = spec(10_000, 0xA11EAD);
        draw_ahead(&s, 3);
        let ahead = order(&s, 3, 0).unwrap();
        // Asked again, the same order is handed out, not drawn anew.
        assert!(Arc::ptr_eq(&ahead, &order(&s, 3, 0).unwrap()));
        let now = EpochOrder::new(&s, 3).unwrap();
        assert_eq!(ahead.epoch(), 3);
        assert_eq!(batches(&ahead), batches(&now));
        // Another epoch, another spec or a resumed remainder is an order of its own.
        let other = order(&s, 4, 0).unwrap();
        assert_ne!(batches(&other), batches(&ahead));
        let rest = order(&s, 3, 500).unwrap();
        assert_eq!(
            batches(&rest),
            batches(&EpochOrder::remainder(&s, 3, 500).unwrap())
        );
    }

    #[test]
    fn only_random_orders_within_the_bound_are_drawn_ahead() {
        let most = AHEAD_MAX_BYTES / 4;
        assert!(drawn_ahead(&spec(most, 1)));
        assert!(!drawn_ahead(&spec(most + 1, 1)));
        let mut block = spec(1000, 1);
        block.shuffle = Shuffle::Block {
            block: 10,
            window: 4,
        };
        assert!(!drawn_ahead(&block));
    }

    #[test]
    fn an_order_that_cannot_be_drawn_gives_its_error() {
        let s = spec(10, 0xE1);
        draw_ahead(&s, 0);
        // Resuming past every record is refused with the rules' own message.
        let err = order(&s, 0, 10).unwrap_err().to_string();
        assert!(
            err.contains("past the end of an epoch of 10 records"),
            "{err}"
        );
    }
}

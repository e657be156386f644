//! Record order for Python: an epoch's size, its order (the records each batch holds, as the
//! loader's readers take them), a position carried over to another world size, and an order's
//! steps carried several to a loader batch.

use std::sync::Arc;

use pinfeed::{BatchRecords, EpochOrder, OrderSpec, Position, Shuffle};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::array_memory;
use crate::errors::{value_error, ToPy};
use crate::loader::Source;
use crate::options::shuffle_arg;

/// ``(records, batches)`` of one rank's epoch (or of the split of its rest after ``consumed``
/// records of its global order), the sizes of ``epoch_order``'s result, with its checks of the
/// rank, world size, batch size and ``drop_last``, but in constant time: the sizes do not depend
/// on the epoch or the shuffle, so no order is drawn.
#[pyfunction]
#[pyo3(signature = (num_records, batch_size, *, drop_last, rank, world_size, consumed=0))]
pub(crate) fn epoch_size(
    py: Python<'_>,
    num_records: u64,
    batch_size: u64,
    drop_last: bool,
    rank: u64,
    world_size: u64,
    consumed: u64,
) -> PyResult<(u64, u64)> {
    sizes_spec(num_records, batch_size, drop_last, rank, world_size)
        .epoch_size(consumed)
        .py_err(py)
}

/// The spec of the sizes of an order: they depend on neither the shuffle nor the seed.
fn sizes_spec(
    num_records: u64,
    batch_size: u64,
    drop_last: bool,
    rank: u64,
    world_size: u64,
) -> OrderSpec {
    OrderSpec {
        num_records,
        batch_size,
        drop_last,
        shuffle: Shuffle::None,
        seed: 0,
        rank,
        world_size,
    }
}

/// The Rust ``Position::reshard``: the position ``(epoch, batches_done, consumed)`` saved at
/// ``from_world_size`` ranks, carried to ``to_world_size`` ranks (an elastic resume), as
/// ``(epoch, batches_done, consumed)``. The job consumed the first ``consumed + batches_done ×
/// from_world_size × batch_size`` records of the epoch's global order; the result splits the
/// rest over the new ranks, or is the next epoch's start when nothing is left. Unchanged when
/// the world size is.
#[pyfunction]
#[pyo3(signature = (
    num_records, batch_size, *, drop_last, epoch, batches_done, consumed, from_world_size,
    to_world_size
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn reshard_position(
    py: Python<'_>,
    num_records: u64,
    batch_size: u64,
    drop_last: bool,
    epoch: u64,
    batches_done: u64,
    consumed: u64,
    from_world_size: u64,
    to_world_size: u64,
) -> PyResult<(u64, u64, u64)> {
    let at = Position {
        epoch,
        batches_done,
        consumed,
    };
    let saved = sizes_spec(num_records, batch_size, drop_last, 0, from_world_size);
    let to = sizes_spec(num_records, batch_size, drop_last, 0, to_world_size);
    let p = at.reshard(&saved, &to).py_err(py)?;
    Ok((p.epoch, p.batches_done, p.consumed))
}

/// One rank's records of one epoch, in batch order, as native-endian 8-byte integers, and the
/// number of batches. Every batch but the last holds ``batch_size`` records; the order is the
/// Rust ``EpochOrder``'s, the one the loader reads.
///
/// Without ``out`` the records come as ``bytes`` (wrap with ``numpy.frombuffer(b,
/// numpy.uint64)``). With ``out``, a writable C-contiguous numpy array of native ``int64`` or
/// ``uint64`` holding exactly this rank's records of the epoch, they are written there (no
/// intermediate copy; the GPU-resident loader passes a view of pinned memory) and ``out`` is
/// returned. Either way the work is done without the GIL. A record index is below 2⁶³ (no
/// order could hold more), so both integer types read the same values.
#[pyfunction]
#[pyo3(signature = (
    num_records, batch_size, *, drop_last, shuffle, block_size=None, block_window=None, seed,
    rank, world_size, epoch, out=None, consumed=0
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn epoch_order<'py>(
    py: Python<'py>,
    num_records: u64,
    batch_size: u64,
    drop_last: bool,
    shuffle: &str,
    block_size: Option<u64>,
    block_window: Option<u64>,
    seed: u64,
    rank: u64,
    world_size: u64,
    epoch: u64,
    out: Option<Bound<'py, PyAny>>,
    consumed: u64,
) -> PyResult<(Bound<'py, PyAny>, u64)> {
    let spec = OrderSpec {
        num_records,
        batch_size,
        drop_last,
        shuffle: shuffle_arg(py, shuffle, block_size, block_window)?,
        seed,
        rank,
        world_size,
    };
    let order = py
        .detach(|| EpochOrder::remainder(&spec, epoch, consumed))
        .py_err(py)?;
    let num_batches = order.num_batches();
    let len = usize::try_from(order.num_records())
        .ok()
        .and_then(|n| n.checked_mul(8))
        .ok_or_else(|| {
            value_error(
                py,
                "Config",
                format!(
                    "the order of {} records does not fit in memory",
                    order.num_records()
                ),
            )
        })?;
    let Some(out) = out.filter(|o| !o.is_none()) else {
        let bytes = PyBytes::new_with(py, len, |buf| {
            // The new bytes object is reachable from no other thread until it is returned, so
            // filling it without the GIL races with nothing.
            py.detach(|| write_order(&order, buf));
            Ok(())
        })?;
        return Ok((bytes.into_any(), num_batches));
    };
    let address = out_address(py, &out, len, &order, rank, epoch)? as *mut u8;
    // SAFETY: `address .. address + len` is the data of `out` (numpy's array interface:
    // C-contiguous, writable, `len` bytes, all checked by `out_address`), alive while `out` is,
    // which this call holds. The caller (the loader's order workers, each with a buffer of its
    // own) touches it only after this returns; nothing else reads or writes it meanwhile.
    let slice = unsafe { std::slice::from_raw_parts_mut(address, len) };
    py.detach(|| write_order(&order, slice));
    Ok((out, num_batches))
}

/// The address of the memory of `out`, checked to hold exactly `len` bytes of native int64 or
/// uint64 records (the order of `rank` in `epoch`) and to be writable.
fn out_address(
    py: Python<'_>,
    out: &Bound<'_, PyAny>,
    len: usize,
    order: &EpochOrder,
    rank: u64,
    epoch: u64,
) -> PyResult<usize> {
    let typestr: String = out
        .getattr("__array_interface__")?
        .get_item("typestr")?
        .extract()?;
    let native = if cfg!(target_endian = "little") {
        ["<i8", "<u8"]
    } else {
        [">i8", ">u8"]
    };
    if !native.contains(&typestr.as_str()) {
        return Err(value_error(
            py,
            "Config",
            format!("epoch_order: out must hold native int64 or uint64, not {typestr}"),
        ));
    }
    if !out
        .getattr("flags")?
        .getattr("writeable")?
        .extract::<bool>()?
    {
        return Err(value_error(py, "Config", "epoch_order: out is read-only"));
    }
    let (address, nbytes, _shape) = array_memory(py, out)?;
    if nbytes != len {
        return Err(value_error(
            py,
            "Config",
            format!(
                "epoch_order: out holds {} records, but rank {rank} has {} in epoch {epoch}",
                nbytes / 8,
                order.num_records()
            ),
        ));
    }
    Ok(address)
}

/// Writes the records of `order`, in batch order, into `out` (8 native-endian bytes each,
/// exactly `order.num_records()` of them): one batch's list at a time, with no list of the
/// whole epoch nor a copy of it.
fn write_order(order: &EpochOrder, out: &mut [u8]) {
    debug_assert_eq!(out.len() as u64, order.num_records() * 8);
    let mut slots = out.chunks_exact_mut(8);
    let mut put = |r: u64| {
        if let Some(slot) = slots.next() {
            slot.copy_from_slice(&r.to_ne_bytes());
        }
    };
    for i in 0..order.num_batches() {
        match order.batch(i) {
            BatchRecords::Range { first, count } => (first..first + count).for_each(&mut put),
            BatchRecords::Indices(records) => records.into_iter().for_each(&mut put),
        }
    }
}

/// A source's records renumbered so that each loader batch carries ``steps`` consecutive steps
/// of one epoch's order (the Rust ``StepGroups``): the order of ``num_records`` (the source's)
/// in batches of ``batch_size``, in file order, at ``world_size`` ranks, after ``consumed``
/// records of its global order. A Loader of :meth:`source` in batches of ``steps ×
/// batch_size`` records, at that world size, gives each rank's steps of the order in groups;
/// a step shorter than ``batch_size`` (the last, at most) fills the start of its place, and
/// what no step holds reads as zeros.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub(crate) struct StepGroups {
    inner: Arc<pinfeed::StepGroups>,
}

#[pymethods]
impl StepGroups {
    #[new]
    #[pyo3(signature = (source, batch_size, steps, *, drop_last, seed, world_size, epoch, consumed=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: PyRef<'_, Source>,
        batch_size: u64,
        steps: u64,
        drop_last: bool,
        seed: u64,
        world_size: u64,
        epoch: u64,
        consumed: u64,
    ) -> PyResult<StepGroups> {
        let spec = OrderSpec {
            num_records: source.inner.num_records(),
            batch_size,
            drop_last,
            shuffle: Shuffle::None,
            seed,
            rank: 0,
            world_size,
        };
        let inner = Arc::clone(&source.inner);
        let groups = py
            .detach(|| pinfeed::StepGroups::new(inner, &spec, epoch, consumed, steps))
            .py_err(py)?;
        Ok(StepGroups {
            inner: Arc::new(groups),
        })
    }

    /// The groups as a loader source.
    fn source(&self) -> Source {
        Source {
            inner: Arc::clone(&self.inner) as Arc<dyn pinfeed_source::Source>,
            gpu_images: None,
        }
    }

    /// Steps of each rank in the epoch (in its split after ``consumed``).
    #[getter]
    fn num_steps(&self) -> u64 {
        self.inner.num_steps()
    }

    /// Records of step ``i`` on every rank: ``batch_size`` but in the last step; 0 past it.
    fn step_len(&self, i: u64) -> u64 {
        self.inner.step_len(i)
    }

    /// The fingerprint of the order (of one step a batch) at ``world_size`` ranks: what a
    /// Loader of one step a batch over the same source puts in its states.
    fn fingerprint_at(&self, world_size: u64) -> u64 {
        OrderSpec {
            world_size,
            ..self.inner.order().spec().clone()
        }
        .fingerprint()
    }
}

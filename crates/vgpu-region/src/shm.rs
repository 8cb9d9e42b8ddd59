//! The mappings a `Region` reads and writes through, and the only unsafe
//! code of the crate: turning a mapping into references to its
//! `#[repr(C)]` structs of atomics.

use crate::core::View;
use crate::layout::{
    file_len, pacing_offset, slot_pacing_offset, slots_offset, totals_offset, RawHeader, RawPacing,
    RawSlot, RawSlotPacing, HEADER_SIZE, MAX_DEVICES,
};
use crate::sync::AtomicU64;
use memmap2::{MmapMut, MmapRaw};

/// Maps `len` bytes of `file` shared, read-write (or read-only).
pub(crate) fn map(file: &std::fs::File, len: u64, writable: bool) -> std::io::Result<MmapRaw> {
    let len =
        usize::try_from(len).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut opts = memmap2::MmapOptions::new();
    opts.len(len);
    if writable {
        opts.map_raw(file)
    } else {
        opts.map_raw_read_only(file)
    }
}

/// `len` bytes of zeroed anonymous memory, private to this process (no
/// file: nothing outside it can shrink it), for `copy` to fill. Pages
/// never written cost nothing.
pub(crate) fn anon(len: u64) -> std::io::Result<MmapMut> {
    let len =
        usize::try_from(len).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    memmap2::MmapOptions::new().len(len).map_anon()
}

/// A filled anonymous mapping, made read-only (`mprotect`): a writer
/// reached on it by mistake faults instead of changing a copy nobody reads.
pub(crate) fn read_only(map: MmapMut) -> std::io::Result<MmapRaw> {
    Ok(MmapRaw::from(map.make_read_only()?))
}

/// Where the sections of a mapping of `slots` slots start, checked once
/// against the mapping's length: the hot paths (every reserve and release
/// builds a [`View`]) then add offsets instead of recomputing the layout
/// and its bounds check each call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    slots: u32,
    totals: usize,
    slot_base: usize,
    pacing: usize,
    slot_pacing: usize,
}

impl Layout {
    /// The layout of `map` holding `slots` slots; panics when the mapping
    /// is shorter than that (a caller's bug: `Region` maps `file_len`).
    pub(crate) fn of(map: &MmapRaw, slots: u32) -> Layout {
        assert!(
            map.len() as u64 >= file_len(slots),
            "mapping shorter than its slots"
        );
        // Each offset is below `file_len(slots)` ≤ `map.len()`: fits usize.
        Layout {
            slots,
            totals: totals_offset(slots) as usize,
            slot_base: slots_offset(slots) as usize,
            pacing: pacing_offset(slots) as usize,
            slot_pacing: slot_pacing_offset(slots) as usize,
        }
    }
}

/// The header and slots of `map`, with the layout `Layout::of` computed
/// for this very mapping.
#[inline]
pub(crate) fn view_at<'a>(map: &'a MmapRaw, l: &Layout) -> View<'a> {
    let slots = l.slots;
    let base = map.as_mut_ptr();
    // SAFETY: `l` is `Layout::of(map, slots)` for this mapping (the only
    // way to make one; `Region` keeps the two together and never remaps),
    // which checked that it is `file_len(slots)` bytes long or more. The
    // mapping is page-aligned (≥ the 64-byte alignment of RawHeader and
    // RawSlot): header, then `slots` owner words at HEADER_SIZE, then
    // MAX_DEVICES * `slots` totals at `totals_offset`, then `slots` slots
    // at `slots_offset`, then MAX_DEVICES pacing cells at `pacing_offset`
    // and `slots` pacing records at `slot_pacing_offset` (page multiples,
    // 64-byte aligned structs), none overlapping. It lives as long as the
    // `&MmapRaw` borrow the returned references carry. Every field is an
    // atomic integer (or an array of them): any bit pattern is a valid
    // value and concurrent writes by other processes go through atomic
    // operations, so shared references to them are sound.
    unsafe {
        View {
            header: &*(base as *const RawHeader),
            owners: std::slice::from_raw_parts(
                base.add(HEADER_SIZE) as *const AtomicU64,
                slots as usize,
            ),
            totals: std::slice::from_raw_parts(
                base.add(l.totals) as *const AtomicU64,
                MAX_DEVICES * slots as usize,
            ),
            slots: std::slice::from_raw_parts(
                base.add(l.slot_base) as *const RawSlot,
                slots as usize,
            ),
            pacing: std::slice::from_raw_parts(base.add(l.pacing) as *const RawPacing, MAX_DEVICES),
            slot_pacing: std::slice::from_raw_parts(
                base.add(l.slot_pacing) as *const RawSlotPacing,
                slots as usize,
            ),
        }
    }
}

/// The header of a mapping at least `HEADER_SIZE` bytes long.
pub(crate) fn header(map: &MmapRaw) -> &RawHeader {
    assert!(map.len() >= HEADER_SIZE, "mapping shorter than a header");
    // SAFETY: as in `view`: aligned, long enough, all-atomic, borrowed.
    unsafe { &*(map.as_mut_ptr() as *const RawHeader) }
}

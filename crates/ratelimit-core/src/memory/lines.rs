//! [`Lines`]: the allocator of a shard's tables, in whole cache lines.
//!
//! A table's entries and its control bytes are one allocation. From the
//! global allocator it starts and ends wherever the heap put it, so its
//! first and last cache lines may hold the heap's next chunk, or the
//! allocation before, which other threads write (a per-request allocation's
//! header, another count). Every probe then missed in the first-level cache
//! on the control bytes' line as well as on the entry's, even on one hot key
//! whose entry and control bytes nothing else wrote (`perf annotate` of
//! `check_now` under `wrk`: the two loads took 70 % of its samples).
//!
//! `Lines` rounds every table's layout up to whole, aligned cache lines, so
//! a table shares no line with any other allocation, and on a table of 32-
//! or 64-byte entries its control bytes start a line of their own: a GCRA
//! check, which writes only its entry's word, leaves the control bytes in
//! every core's cache.

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global};

/// A cache line (64 bytes on x86-64 and most ARM cores).
const LINE: usize = 64;

/// The global allocator, for layouts rounded up to whole cache lines.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Lines;

/// `layout` rounded up: aligned to a line, its size a multiple of lines.
fn lines(layout: Layout) -> Result<Layout, AllocError> {
    Ok(layout
        .align_to(LINE)
        .map_err(|_| AllocError)?
        .pad_to_align())
}

// SAFETY: every block comes from `Global` and goes back to it with the same
// layout (`lines` is a pure function of the layout the caller passes, and
// the `Allocator` contract has the caller pass the same layout to
// `deallocate` as to `allocate`); the rounded layout is at least as large
// and as aligned as the one asked for, so the block fits it.
#[allow(unsafe_code)]
unsafe impl Allocator for Lines {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        Global.allocate(lines(layout)?)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // `allocate` succeeded for this layout, so rounding it succeeds again.
        if let Ok(rounded) = lines(layout) {
            // SAFETY: `ptr` was allocated by `Global` with `rounded` (see
            // above), and the caller gives it back once.
            unsafe { Global.deallocate(ptr, rounded) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_rounded_to_whole_lines() {
        for (size, align) in [(1, 1), (20, 16), (148, 32), (64, 64), (65, 8), (4096, 128)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let rounded = lines(layout).unwrap();
            assert_eq!(rounded.align(), align.max(LINE));
            assert_eq!(rounded.size() % LINE, 0);
            assert!(rounded.size() >= size && rounded.size() < size + rounded.align());
        }
    }

    #[test]
    fn blocks_start_on_a_line_and_fill_whole_lines() {
        for (size, align) in [(1, 1), (148, 32), (1000, 16)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let block = Lines.allocate(layout).unwrap();
            assert_eq!(block.as_ptr().cast::<u8>() as usize % LINE, 0);
            assert_eq!(block.len() % LINE, 0);
            assert!(block.len() >= size);
            // SAFETY: allocated just above by `Lines` with this layout.
            #[allow(unsafe_code)]
            unsafe {
                Lines.deallocate(block.cast(), layout)
            };
        }
    }

    #[test]
    fn a_table_in_lines_keeps_what_it_holds_as_it_grows() {
        let mut table = hashbrown::HashTable::<[u64; 4], Lines>::new_in(Lines);
        let hasher = |e: &[u64; 4]| e[0].wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..1000u64 {
            table.insert_unique(hasher(&[i; 4]), [i; 4], hasher);
        }
        for i in 0..1000u64 {
            assert_eq!(table.find(hasher(&[i; 4]), |e| e[0] == i), Some(&[i; 4]));
        }
        table.retain(|e| e[0] % 2 == 0);
        table.shrink_to_fit(hasher);
        assert_eq!(table.len(), 500);
        assert!(table.find(hasher(&[3; 4]), |e| e[0] == 3).is_none());
    }
}

//! The heap of a short-lived command in the static (musl) build.
//!
//! musl's allocator (mallocng) takes one lock around every call and maps and unmaps pages
//! for small blocks, often while holding that lock. A one-shot `exec` or `run` has four
//! threads allocating at once for a few milliseconds (the policy's load, the schema
//! validator's build, the supervisor's start, the spawner), and in the static build they
//! spent a quarter of the run's CPU in the allocator, its lock and its `futex` waits
//! (docs/performance-oneshot.md). mallocng stays the heap of the long-lived commands
//! (`serve`, `mcp`, `bench`): it hands memory back after a burst, which the daemon's memory
//! targets depend on and which dlmalloc does not. Every other command switches, first thing in
//! `main`, to dlmalloc behind one lock, which takes memory in large steps and keeps it.
//!
//! dlmalloc's memory comes from one address range reserved when the switch is made, so a
//! block's address says which allocator it came from: blocks made before the switch (the
//! runtime's, the arguments') are still freed by musl's. Freed ranges are remapped
//! inaccessible, never unmapped, so no mapping of musl's can later land inside the range.
//! If the range cannot be reserved, or is used up, blocks come from musl's allocator.
//!
//! The glibc build keeps glibc's allocator, whose per-thread arenas do not contend (7
//! `futex` calls in a one-shot run against mallocng's 371); there the heap is compiled
//! for its tests only.
#![cfg_attr(not(target_env = "musl"), allow(dead_code))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Address space reserved for the switched heap: far more than a one-shot command uses
/// (its largest buffers are a call's output, capped in the megabytes), small enough that a
/// modest `RLIMIT_AS` still leaves room; past it, blocks come from musl's allocator.
const RESERVED: usize = 8 << 30;

const PAGE: usize = 4096;

#[cfg(target_env = "musl")]
#[global_allocator]
static HEAP: SwitchableHeap = SwitchableHeap::new();

/// Gives a short-lived command the switched heap; in the glibc build, does nothing.
/// Call it before the command starts a thread.
pub(crate) fn switch_for_short_lived_command() {
    #[cfg(target_env = "musl")]
    HEAP.switch_to_dlmalloc();
}

/// musl's allocator for blocks made before the switch or outside the reserved range, and
/// dlmalloc for the rest once [`SwitchableHeap::switch_to_dlmalloc`] has been called.
pub(crate) struct SwitchableHeap {
    switched: AtomicBool,
    /// Start of the reserved range; 0 until it is reserved.
    base: AtomicUsize,
    dlmalloc: Mutex<Option<dlmalloc::Dlmalloc<Range>>>,
}

impl SwitchableHeap {
    pub(crate) const fn new() -> Self {
        Self {
            switched: AtomicBool::new(false),
            base: AtomicUsize::new(0),
            dlmalloc: Mutex::new(None),
        }
    }

    /// Serves blocks from dlmalloc from now on. Call it before the process starts a thread
    /// (then every thread sees the switch); calling it again does nothing.
    pub(crate) fn switch_to_dlmalloc(&self) {
        let mut heap = self.dlmalloc.lock().unwrap_or_else(PoisonError::into_inner);
        if heap.is_some() || self.switched.load(Ordering::Acquire) {
            return;
        }
        let Some(range) = Range::reserve(RESERVED) else {
            return;
        };
        self.base.store(range.base, Ordering::Release);
        *heap = Some(dlmalloc::Dlmalloc::new_with_allocator(range));
        self.switched.store(true, Ordering::Release);
    }

    /// Whether `block` lies in the reserved range, so came from dlmalloc.
    fn owns(&self, block: *mut u8) -> bool {
        let base = self.base.load(Ordering::Acquire);
        let addr = block as usize;
        base != 0 && addr >= base && addr - base < RESERVED
    }

    /// Runs `f` on dlmalloc, or returns None before the switch.
    fn with_dlmalloc<T>(&self, f: impl FnOnce(&mut dlmalloc::Dlmalloc<Range>) -> T) -> Option<T> {
        if !self.switched.load(Ordering::Acquire) {
            return None;
        }
        // A panic cannot happen inside dlmalloc with the lock held, so a poisoned lock
        // still guards a consistent heap.
        let mut heap = self.dlmalloc.lock().unwrap_or_else(PoisonError::into_inner);
        heap.as_mut().map(f)
    }
}

impl std::fmt::Debug for SwitchableHeap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the heap itself: formatting it would take its lock.
        f.debug_struct("SwitchableHeap")
            .field("switched", &self.switched)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Default for SwitchableHeap {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every block is freed and resized by the allocator that made it, told apart by its
// address (`owns`); dlmalloc is only used under its mutex, which never allocates (std's
// mutex is a futex word), and its memory is the reserved range `Range` hands out once.
unsafe impl GlobalAlloc for SwitchableHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let block = self
            .with_dlmalloc(|heap| {
                // SAFETY: GlobalAlloc's contract gives a non-zero size and a valid alignment.
                unsafe { heap.malloc(layout.size(), layout.align()) }
            })
            .unwrap_or(ptr::null_mut());
        if block.is_null() {
            // SAFETY: as above.
            unsafe { System.alloc(layout) }
        } else {
            block
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let block = self
            .with_dlmalloc(|heap| {
                // SAFETY: as in `alloc`.
                unsafe { heap.calloc(layout.size(), layout.align()) }
            })
            .unwrap_or(ptr::null_mut());
        if block.is_null() {
            // SAFETY: as in `alloc`.
            unsafe { System.alloc_zeroed(layout) }
        } else {
            block
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if self.owns(block) {
            let freed = self.with_dlmalloc(|heap| {
                // SAFETY: the block is dlmalloc's (it lies in its range), with its layout.
                unsafe { heap.free(block, layout.size(), layout.align()) }
            });
            debug_assert!(freed.is_some(), "a block in the range before the switch");
        } else {
            // SAFETY: a block outside the range is musl's, with the layout it was made with.
            unsafe { System.dealloc(block, layout) }
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !self.owns(block) {
            // SAFETY: musl's block, its layout and a non-zero new size, as the caller gave.
            return unsafe { System.realloc(block, layout, new_size) };
        }
        let grown = self
            .with_dlmalloc(|heap| {
                // SAFETY: dlmalloc's block with its layout; `new_size` is non-zero.
                unsafe { heap.realloc(block, layout.size(), layout.align(), new_size) }
            })
            .unwrap_or(ptr::null_mut());
        if !grown.is_null() {
            return grown;
        }
        // The range is used up: move the block to musl's allocator.
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        // SAFETY: a valid, non-zero layout.
        let moved = unsafe { System.alloc(new_layout) };
        if !moved.is_null() {
            // SAFETY: both blocks are live and distinct, and each is at least this long.
            unsafe { ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size)) };
            // SAFETY: as in `dealloc`; the old block is not used again.
            unsafe { self.dealloc(block, layout) };
        }
        moved
    }
}

/// The reserved address range dlmalloc takes its memory from: pages are made accessible
/// from the bottom up as dlmalloc asks, and made inaccessible again when it gives them
/// back; addresses are not handed out twice.
#[derive(Debug)]
struct Range {
    base: usize,
    /// Offset of the first page not yet handed out.
    next: AtomicUsize,
}

impl Range {
    fn reserve(len: usize) -> Option<Self> {
        super::reserve_address_range(len).map(|base| Self {
            base,
            next: AtomicUsize::new(0),
        })
    }
}

// SAFETY: `alloc` hands out page-aligned, readable and writable, zeroed regions inside the
// reservation, each once; `free` and `free_part` only make pages inaccessible, so the
// range stays reserved; `remap` declines (dlmalloc then copies).
unsafe impl dlmalloc::Allocator for Range {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        let size = size.next_multiple_of(PAGE);
        // Only called with dlmalloc's lock held, so a plain load and store would do; the
        // atomic keeps `Range` Send and Sync without an argument.
        let start = self.next.load(Ordering::Relaxed);
        if size == 0 || RESERVED - start < size {
            return (ptr::null_mut(), 0, 0);
        }
        let addr = self.base + start;
        if !super::commit_pages(addr, size) {
            return (ptr::null_mut(), 0, 0);
        }
        self.next.store(start + size, Ordering::Relaxed);
        (addr as *mut u8, size, 0)
    }

    fn remap(&self, _ptr: *mut u8, _oldsize: usize, _newsize: usize, _can_move: bool) -> *mut u8 {
        ptr::null_mut()
    }

    fn free_part(&self, block: *mut u8, oldsize: usize, newsize: usize) -> bool {
        let tail = (block as usize + newsize).next_multiple_of(PAGE);
        let end = block as usize + oldsize;
        tail >= end || super::decommit_pages(tail, end - tail)
    }

    fn free(&self, block: *mut u8, size: usize) -> bool {
        super::decommit_pages(block as usize, size)
    }

    fn can_release_part(&self, _flags: u32) -> bool {
        true
    }

    fn allocates_zeros(&self) -> bool {
        true
    }

    fn page_size(&self) -> usize {
        PAGE
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn fill_and_check(heap: &SwitchableHeap, size: usize, align: usize) -> (*mut u8, Layout) {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: a non-zero layout; the block is written within its size.
        unsafe {
            let block = heap.alloc(layout);
            assert!(!block.is_null());
            assert_eq!(block as usize % align, 0);
            block.write_bytes(0x5a, size);
            (block, layout)
        }
    }

    #[test]
    fn blocks_made_before_the_switch_are_freed_and_grown_by_musls_allocator() {
        let heap = SwitchableHeap::new();
        let (early, layout) = fill_and_check(&heap, 100, 8);
        assert!(!heap.owns(early));
        heap.switch_to_dlmalloc();
        let (late, late_layout) = fill_and_check(&heap, 100, 8);
        assert!(
            heap.owns(late),
            "after the switch blocks come from the range"
        );
        // SAFETY: each block with the layout it was made with; realloc's result is used.
        unsafe {
            let grown = heap.realloc(early, layout, 5000);
            assert!(!grown.is_null());
            assert!(
                !heap.owns(grown),
                "a block made before stays with its allocator"
            );
            assert_eq!(*grown.add(99), 0x5a);
            heap.dealloc(grown, Layout::from_size_align(5000, 8).unwrap());
            heap.dealloc(late, late_layout);
        }
    }

    #[test]
    fn the_switched_heap_zeroes_grows_and_reuses_across_threads() {
        static HEAP: SwitchableHeap = SwitchableHeap::new();
        HEAP.switch_to_dlmalloc();
        HEAP.switch_to_dlmalloc();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..200usize {
                        let size = 1 + (round * 37 + t * 11) % 3000;
                        let (block, layout) = fill_and_check(&HEAP, size, 16);
                        assert!(HEAP.owns(block));
                        // SAFETY: the block with its layout; the grown one is freed with
                        // the new size.
                        unsafe {
                            let grown = HEAP.realloc(block, layout, size * 3);
                            assert_eq!(*grown.add(size - 1), 0x5a, "realloc keeps the contents");
                            HEAP.dealloc(grown, Layout::from_size_align(size * 3, 16).unwrap());
                        }
                    }
                    let big = Layout::from_size_align(3 << 20, 64).unwrap();
                    // SAFETY: a non-zero layout; the block is read within its size and
                    // freed with it.
                    unsafe {
                        let zeroed = HEAP.alloc_zeroed(big);
                        assert!(HEAP.owns(zeroed));
                        assert!(
                            std::slice::from_raw_parts(zeroed, 3 << 20)
                                .iter()
                                .all(|b| *b == 0)
                        );
                        zeroed.write_bytes(1, 3 << 20);
                        HEAP.dealloc(zeroed, big);
                        // Memory given back and taken again is zeroed again.
                        let again = HEAP.alloc_zeroed(big);
                        assert!(
                            std::slice::from_raw_parts(again, 3 << 20)
                                .iter()
                                .all(|b| *b == 0)
                        );
                        HEAP.dealloc(again, big);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn a_used_up_range_hands_out_nothing_and_the_heap_falls_back() {
        let range = Range::reserve(RESERVED).unwrap();
        range.next.store(RESERVED - PAGE, Ordering::Relaxed);
        let (block, size, _) = dlmalloc::Allocator::alloc(&range, 2 * PAGE);
        assert!(block.is_null() && size == 0);
        let (block, size, _) = dlmalloc::Allocator::alloc(&range, PAGE);
        assert!(!block.is_null() && size == PAGE);
        assert!(dlmalloc::Allocator::free(&range, block, size));
    }
}

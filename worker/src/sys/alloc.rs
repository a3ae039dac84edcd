//! The worker program's heap: dlmalloc without a lock, for a process with one thread.
//!
//! Built against musl, the worker does not use musl's allocator (mallocng maps and unmaps
//! pages for small allocations: 44 mmap/munmap/brk calls per worker against glibc's 5, each
//! unmap a TLB flush). dlmalloc's own global allocator takes a pthread mutex around every
//! call, a visible share of a worker's user time (`pthread_mutex_lock`/`unlock` and
//! `dlmalloc::global::lock` in a profile) spent on a lock nobody else can take.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;

/// A global allocator for a single-threaded program. Only the worker program installs it
/// (`src/main.rs`): it never starts a thread, and the children it starts with
/// [`super::spawn_vfork`] share its memory but do not allocate (that function's contract).
#[derive(Debug)]
pub struct SingleThreadedHeap(UnsafeCell<dlmalloc::Dlmalloc>);

impl SingleThreadedHeap {
    /// An empty heap; memory is taken from the kernel on first use.
    pub const fn new() -> Self {
        Self(UnsafeCell::new(dlmalloc::Dlmalloc::new()))
    }
}

impl Default for SingleThreadedHeap {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: `Sync` is required of a global allocator's static. The heap is only ever used by
// one thread at a time because the program that installs it has one thread (see the type's
// documentation); no signal handler of the worker allocates.
unsafe impl Sync for SingleThreadedHeap {}

// SAFETY: every method forwards to dlmalloc with the layout the caller gave, which is what
// dlmalloc's own (locking) GlobalAlloc does; exclusive access to the heap holds as above.
unsafe impl GlobalAlloc for SingleThreadedHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: one thread, so this is the only reference to the heap for the call.
        let heap = unsafe { &mut *self.0.get() };
        // SAFETY: GlobalAlloc's contract gives a non-zero size and a valid alignment.
        unsafe { heap.malloc(layout.size(), layout.align()) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let heap = unsafe { &mut *self.0.get() };
        // SAFETY: as in `alloc`.
        unsafe { heap.calloc(layout.size(), layout.align()) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as in `alloc`.
        let heap = unsafe { &mut *self.0.get() };
        // SAFETY: the caller passes a block this allocator returned, with its layout.
        unsafe { heap.free(ptr, layout.size(), layout.align()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let heap = unsafe { &mut *self.0.get() };
        // SAFETY: `ptr` came from this allocator with `layout`; `new_size` is non-zero.
        unsafe { heap.realloc(ptr, layout.size(), layout.align(), new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_threaded_heap_allocates_grows_zeroes_and_frees() {
        let heap = SingleThreadedHeap::new();
        let layout = Layout::from_size_align(24, 8).unwrap();
        // SAFETY: this test is the heap's only user; every block is freed with its layout.
        unsafe {
            let block = heap.alloc(layout);
            assert!(!block.is_null());
            assert_eq!(block as usize % 8, 0);
            block.write_bytes(0xab, 24);
            let grown = heap.realloc(block, layout, 4096);
            assert!(!grown.is_null());
            assert_eq!(*grown.add(23), 0xab, "realloc keeps the contents");
            heap.dealloc(grown, Layout::from_size_align(4096, 8).unwrap());
            let big = Layout::from_size_align(1 << 20, 64).unwrap();
            let zeroed = heap.alloc_zeroed(big);
            assert!(!zeroed.is_null());
            assert_eq!(zeroed as usize % 64, 0);
            assert!(
                std::slice::from_raw_parts(zeroed, 1 << 20)
                    .iter()
                    .all(|b| *b == 0)
            );
            heap.dealloc(zeroed, big);
        }
    }
}

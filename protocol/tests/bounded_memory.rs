//! Measures what hostile input makes the decoder allocate, with a counting global allocator:
//! a huge length prefix allocates nothing, and a body claiming 2^60 elements stays far below
//! the frame limit instead of aborting the process (bincode-org/bincode#764).
// Test helpers outside `#[test]` fns are not covered by clippy.toml's allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Cursor;

use airlock_protocol::codec::{CodecError, MAX_FRAME_BYTES};
use airlock_protocol::frame::{FrameDecoder, FrameError, read_frame};
use airlock_protocol::{SupervisorMessage, WorkerMessage};

/// Counts bytes allocated by the current thread (tests run on parallel threads, so a global
/// counter would mix them up).
struct CountingAllocator;

thread_local! {
    static LIVE_BYTES: Cell<usize> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<usize> = const { Cell::new(0) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn record_alloc(size: usize) {
    // `try_with`: the thread-local may already be gone while the thread shuts down.
    let _ = LIVE_BYTES.try_with(|live| {
        let now = live.get() + size;
        live.set(now);
        let _ = PEAK_BYTES.try_with(|peak| peak.set(peak.get().max(now)));
    });
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

fn record_free(size: usize) {
    let _ = LIVE_BYTES.try_with(|live| live.set(live.get().saturating_sub(size)));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// bookkeeping only touches const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as our caller's; `layout` is passed through.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            record_alloc(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as our caller's; `layout` is passed through.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            record_alloc(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through this allocator) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        record_free(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller upholds the rest.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            record_free(layout.size());
            record_alloc(new_size);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// What `f` allocated on this thread: (number of allocations, peak live bytes above the start).
fn measure<R>(f: impl FnOnce() -> R) -> (R, usize, usize) {
    let start_live = LIVE_BYTES.with(Cell::get);
    PEAK_BYTES.with(|peak| peak.set(start_live));
    let start_count = ALLOCATIONS.with(Cell::get);
    let result = f();
    let peak = PEAK_BYTES.with(Cell::get) - start_live;
    let count = ALLOCATIONS.with(Cell::get) - start_count;
    (result, count, peak)
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn claim(variant_and_fields: &[u8], len: u64) -> Vec<u8> {
    let mut body = variant_and_fields.to_vec();
    body.push(0xFD);
    body.extend_from_slice(&len.to_le_bytes());
    body.extend_from_slice(&[1, b'x', 0, 0]);
    frame(&body)
}

const ONE_MIB: usize = 1 << 20;

#[test]
fn allocator_counts_this_threads_allocations() {
    let (buffer, count, peak) = measure(|| vec![1_u8; ONE_MIB]);
    assert_eq!(count, 1);
    assert_eq!(peak, ONE_MIB);
    drop(buffer);
}

#[test]
fn huge_length_prefix_allocates_nothing() {
    let bytes = [0xFF_u8, 0xFF, 0xFF, 0xFF, 0, 0, 0];
    let mut decoder = FrameDecoder::new();
    let (result, count, _) = measure(|| {
        let mut input = &bytes[..];
        decoder.decode_frame(&mut input).map(|_| ())
    });
    assert!(matches!(result, Err(FrameError::TooLarge { .. })));
    assert_eq!(count, 0, "FrameDecoder allocated for a refused frame");

    let mut reader = Cursor::new(bytes);
    let (result, count, _) = measure(|| read_frame::<_, WorkerMessage>(&mut reader).map(|_| ()));
    assert!(matches!(result, Err(FrameError::TooLarge { .. })));
    assert_eq!(count, 0, "read_frame allocated for a refused frame");
}

#[test]
fn announced_but_unsent_body_reserves_nothing() {
    let prefix = u32::try_from(MAX_FRAME_BYTES).unwrap().to_be_bytes();
    let mut decoder = FrameDecoder::new();
    let (result, count, _) = measure(|| {
        let mut input = &prefix[..];
        decoder
            .decode_frame(&mut input)
            .map(|frame| frame.is_none())
    });
    assert!(matches!(result, Ok(true)));
    assert_eq!(count, 0);
    assert!(decoder.end_of_stream().is_err());
}

#[test]
fn claims_of_two_to_the_sixty_elements_stay_within_a_few_mib() {
    let cases: [(&str, Vec<u8>); 5] = [
        // RunFailed.message: a String.
        ("string", claim(&[5], 1 << 60)),
        // Ready.namespaces: Vec<String>.
        ("vec of strings", claim(&[1], 1 << 60)),
        // Exited.stdout: Vec<u8> after status Code(0).
        ("bytes", claim(&[4, 0, 0], 1 << 60)),
        // Ready.namespaces with the largest possible length.
        ("u64::MAX", claim(&[1], u64::MAX)),
        // Ready.namespaces with a length just under the decode budget.
        (
            "budget-sized vec",
            claim(&[1], (MAX_FRAME_BYTES / 32) as u64),
        ),
    ];
    for (name, bytes) in cases {
        let (result, _, peak) = measure(|| {
            read_frame::<_, WorkerMessage>(&mut Cursor::new(bytes.as_slice())).map(|_| ())
        });
        assert!(
            matches!(
                result,
                Err(FrameError::Codec(
                    CodecError::UnexpectedEnd | CodecError::LimitExceeded { .. }
                ))
            ),
            "{name}: {result:?}"
        );
        assert!(peak <= 2 * ONE_MIB, "{name}: peak {peak} bytes");
    }
}

#[test]
fn setup_with_huge_claims_stays_within_a_few_mib() {
    // SupervisorMessage::Setup: profile string claiming 2^60 bytes, then mounts claiming 2^60.
    let profile = claim(&[1], 1 << 60);
    let mounts = claim(&[1, 0, 0], 1 << 60);
    for bytes in [profile, mounts] {
        let (result, _, peak) = measure(|| {
            read_frame::<_, SupervisorMessage>(&mut Cursor::new(bytes.as_slice())).map(|_| ())
        });
        assert!(matches!(result, Err(FrameError::Codec(_))), "{result:?}");
        assert!(peak <= 2 * ONE_MIB, "peak {peak} bytes");
    }
}

/// The one case where a small frame costs more than its size: a string claiming just under
/// the budget is allocated (zeroed, so mostly untouched pages) before bincode finds the input
/// short. It is still bounded by the frame limit, and the worker is killed after it.
#[test]
fn string_claim_under_the_budget_is_bounded_by_the_frame_limit() {
    let bytes = claim(&[5], (MAX_FRAME_BYTES - 64) as u64);
    let (result, _, peak) =
        measure(|| read_frame::<_, WorkerMessage>(&mut Cursor::new(bytes.as_slice())).map(|_| ()));
    assert!(
        matches!(result, Err(FrameError::Codec(CodecError::UnexpectedEnd))),
        "{result:?}"
    );
    assert!(peak <= MAX_FRAME_BYTES + ONE_MIB, "peak {peak} bytes");
}

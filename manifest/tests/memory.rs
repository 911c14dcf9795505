//! What a submission's sweep holds, against the bytes that carried it: a
//! hostile sender's list or table must not cost the runner many times what
//! was sent.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

use gleaner_manifest::{Manifest, ParamList, ParamSpec, ParamValue, Sweep, Table};

/// Counts this thread's allocations, so that tests running side by side do
/// not see each other's.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(change: isize, size: usize) {
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + change);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        note(-(layout.size() as isize), 0);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, size) };
        if !q.is_null() {
            note(size as isize - layout.size() as isize, size);
        }
        q
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f`, giving what it left allocated, its peak above the start, and
/// its largest single allocation.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize, usize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    LARGEST.with(|l| l.set(0));
    let out = f();
    let live = LIVE.with(Cell::get) - start;
    let peak = PEAK.with(Cell::get) - start;
    (
        out,
        live.max(0) as usize,
        peak as usize,
        LARGEST.with(Cell::get),
    )
}

const ITEMS: usize = 1_000_000;

fn submission() -> Manifest {
    let list = ParamList::new(std::iter::repeat_n(ParamValue::Int(1), ITEMS)).unwrap();
    let table = Table::new(
        "l.txt",
        vec!["line".into()],
        std::iter::repeat_n(["a"], ITEMS),
    )
    .unwrap();
    Manifest {
        sweep: Some(Sweep {
            command: "{x} {line}".into(),
            params: [("x".to_owned(), ParamSpec::List(list))]
                .into_iter()
                .collect(),
            csv: None,
            lines: Some("l.txt".into()),
            tables: vec![table],
        }),
        ..Manifest::named("hostile")
    }
}

/// The bound the types state: 5 bytes held for each byte sent (a list's
/// one-byte integer is a 4-byte end and its byte), plus a little per list.
const MULTIPLE: usize = 5;

#[test]
fn a_sweep_holds_a_small_multiple_of_the_bytes_sent() {
    let encoded = rmp_serde::to_vec_named(&submission()).unwrap();
    let (read, live, peak, _) = measure(|| rmp_serde::from_slice::<Manifest>(&encoded).unwrap());
    let sweep = read.sweep.as_ref().unwrap();
    let list = sweep.params["x"].heap_bytes();
    let table = sweep.tables[0].heap_bytes();
    // A one-byte item is sent as 1 byte, a row of one one-character cell
    // as 3 (the row's length, the cell's, the character).
    assert!(list <= MULTIPLE * ITEMS + 100, "list: {list} bytes");
    assert!(table <= 3 * 3 * ITEMS + 200, "table: {table} bytes");
    let held = list + table;
    let multiple = held as f64 / encoded.len() as f64;
    eprintln!(
        "sent {} bytes; held {held} ({multiple:.2}×), {live} live after reading ({:.2}×), \
         peak while reading {peak} ({:.2}×)",
        encoded.len(),
        live as f64 / encoded.len() as f64,
        peak as f64 / encoded.len() as f64,
    );
    assert!(
        held <= MULTIPLE * encoded.len(),
        "held {multiple:.2}× the bytes sent"
    );
    // What the allocator saw agrees with what the buffers say they hold.
    assert!(live <= held + 4096, "{live} live, {held} counted");
    assert_eq!(read, submission());
}

#[test]
fn a_claimed_length_reserves_nothing_big() {
    let mut manifest = submission();
    let sweep = manifest.sweep.as_mut().unwrap();
    sweep.params = [(
        "x".to_owned(),
        ParamSpec::List(ParamList::new([ParamValue::Int(77)]).unwrap()),
    )]
    .into_iter()
    .collect();
    sweep.tables = vec![Table::new("l.txt", vec!["line".into()], [["q"]]).unwrap()];
    let encoded = rmp_serde::to_vec_named(&manifest).unwrap();
    // A list of 4 294 967 295 items (array32), of which one arrives.
    let claim = [0xdd, 0xff, 0xff, 0xff, 0xff];
    let replace = |from: &[u8], to: &[u8]| {
        let at = encoded.windows(from.len()).position(|w| w == from).unwrap();
        [&encoded[..at], to, &encoded[at + 1..]].concat()
    };
    for bytes in [
        replace(&[0x91, 77], &claim),
        replace(&[0x91, 0x91, 0xa1, b'q'], &claim),
        replace(&[0x91, 0xa1, b'q'], &claim),
    ] {
        let (read, _, peak, largest) = measure(|| rmp_serde::from_slice::<Manifest>(&bytes));
        assert!(read.is_err());
        assert!(largest <= 1 << 17, "allocated {largest} bytes at once");
        assert!(peak <= 1 << 18, "{peak} bytes at the peak");
    }
}
